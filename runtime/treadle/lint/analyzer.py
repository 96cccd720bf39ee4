"""Reads one Python source and reports what breaks replay inside its workflow functions.

Nothing is imported or run: the source is parsed (``ast``), its imports are read into
an alias map (module level, and inside each workflow function), and every function
decorated as a workflow (``@<anything>.workflow``, with or without arguments; nested
in a class or a function too) is walked, nested functions and lambdas included. A call
is reported when its qualified name (aliases followed, see ``rules``) or its method
name breaks a rule; ``global``/``nonlocal`` and a mutation of a module-level object
(assignment into it, ``del``, a mutating method) are reported too. A name the workflow
binds itself (a parameter, an assignment, its own import) shadows the module's: its
calls are judged by what it was bound to in the function, if an import, else not at
all.

A finding on a line carrying ``# treadle: ignore[CODE]`` (several codes comma
separated; ``# treadle: ignore`` for every code) is dropped.

Used by ``treadle.lint`` (``lint_source``).
"""

from __future__ import annotations

import ast
import builtins
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass

from treadle.lint import rules

_IGNORE = re.compile(r"#\s*treadle:\s*ignore(?:\[([A-Za-z0-9_,\s]*)\])?")
ALL_CODES = "*"


@dataclass(frozen=True, order=True)
class Finding:
    path: str
    line: int
    col: int
    code: str
    message: str
    replacement: str
    workflow: str

    def text(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message}; {self.replacement}"

    def as_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "line": self.line,
            "col": self.col,
            "code": self.code,
            "message": self.message,
            "replacement": self.replacement,
            "workflow": self.workflow,
        }


def suppressions(source: str) -> dict[int, set[str]]:
    """Line -> codes ignored there (``ALL_CODES`` for a bare ``# treadle: ignore``)."""
    out: dict[int, set[str]] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type != tokenize.COMMENT:
                continue
            found = _IGNORE.search(tok.string)
            if found is None:
                continue
            codes = found.group(1)
            wanted = (
                {c.strip().upper() for c in codes.split(",") if c.strip()}
                if codes is not None
                else {ALL_CODES}
            )
            out.setdefault(tok.start[0], set()).update(wanted or {ALL_CODES})
    except (tokenize.TokenError, SyntaxError):
        pass  # the parse already succeeded; an odd tail only loses its comments
    return out


def _imports(node: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, str]]:
    """(bound name, qualified name) of one import statement."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname is not None:
                yield alias.asname, alias.name
            else:
                root = alias.name.split(".")[0]
                yield root, root
        return
    if node.level or node.module is None:
        return  # a relative import names the user's own modules
    for alias in node.names:
        if alias.name != "*":
            yield alias.asname or alias.name, f"{node.module}.{alias.name}"


def _module_scope(tree: ast.Module) -> tuple[dict[str, str], set[str]]:
    """The module's import aliases, and every name it binds at its top level."""
    aliases: dict[str, str] = {}
    bound: set[str] = set()
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            for name, qualified in _imports(stmt):
                aliases[name] = qualified
                bound.add(name)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(stmt.name)
        elif isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                bound.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(stmt, ast.If | ast.Try | ast.With):
            # Top-level conditional imports and definitions bind module names too.
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(stmt, field, []):
                    if isinstance(child, ast.ExceptHandler):
                        stack.extend(child.body)
                    elif isinstance(child, ast.stmt):
                        stack.append(child)
    return aliases, bound


def _is_workflow_decorator(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "workflow"


def _workflow_name(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    for decorator in fn.decorator_list:
        if isinstance(decorator, ast.Call) and _is_workflow_decorator(decorator):
            for keyword in decorator.keywords:
                value = keyword.value
                named = keyword.arg == "name" and isinstance(value, ast.Constant)
                if named and isinstance(value, ast.Constant) and isinstance(value.value, str):
                    return value.value
    return fn.name


def _root(node: ast.expr) -> ast.Name | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node if isinstance(node, ast.Name) else None


class _WorkflowChecker:
    """Walks one workflow function and collects its findings."""

    def __init__(
        self,
        fn: ast.FunctionDef | ast.AsyncFunctionDef,
        path: str,
        module_aliases: dict[str, str],
        module_bound: set[str],
    ) -> None:
        self.fn = fn
        self.path = path
        self.workflow = _workflow_name(fn)
        self.module_aliases = module_aliases
        self.module_bound = module_bound
        self.aliases: dict[str, str] = {}
        self.local: set[str] = set()
        self.declared_outer: set[str] = set()
        self.findings: list[Finding] = []
        self._collect_scope()

    def _collect_scope(self) -> None:
        for node in ast.walk(self.fn):
            if isinstance(node, ast.Global | ast.Nonlocal):
                self.declared_outer.update(node.names)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                for name, qualified in _imports(node):
                    self.aliases[name] = qualified
            elif isinstance(node, ast.arg):
                self.local.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
                self.local.add(node.id)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if node is not self.fn:
                    self.local.add(node.name)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                self.local.add(node.name)
        self.local -= self.declared_outer

    # -- names ------------------------------------------------------------------------

    def qualified(self, node: ast.expr) -> str | None:
        """The dotted name ``node`` resolves to through the imports, or None."""
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                return self.aliases[node.id]
            if node.id in self.local:
                return None
            if node.id in self.module_aliases:
                return self.module_aliases[node.id]
            if node.id not in self.module_bound and hasattr(builtins, node.id):
                return node.id
            return None
        if isinstance(node, ast.Attribute):
            base = self.qualified(node.value)
            return None if base is None else f"{base}.{node.attr}"
        return None

    def module_level(self, node: ast.expr) -> ast.Name | None:
        """The module-level name at the root of ``node`` (``CACHE`` in ``CACHE[k].x``)."""
        root = _root(node)
        if root is None or root.id in self.aliases:
            return None
        if root.id in self.local:
            return None
        if root.id in self.module_bound or root.id in self.declared_outer:
            return root
        return None

    # -- reporting --------------------------------------------------------------------

    def report(self, node: ast.AST, rule: rules.Rule, what: str) -> None:
        self.findings.append(
            Finding(
                path=self.path,
                line=getattr(node, "lineno", 1),
                col=getattr(node, "col_offset", 0) + 1,
                code=rule.code,
                message=f"{what} {rule.title} in workflow {self.workflow!r}",
                replacement=f"use {rule.replacement}"
                if not rule.replacement.startswith(("move", "keep"))
                else rule.replacement,
                workflow=self.workflow,
            )
        )

    def check(self) -> list[Finding]:
        for node in ast.walk(self.fn):
            if isinstance(node, ast.Global | ast.Nonlocal):
                kind = "global" if isinstance(node, ast.Global) else "nonlocal"
                self.report(node, rules.GLOBAL_STATEMENT, f"'{kind} {', '.join(node.names)}'")
            elif isinstance(node, ast.Call):
                self._call(node)
            elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
                targets = (
                    node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
                )
                for target in targets:
                    self._store(target)
        return self.findings

    def _call(self, node: ast.Call) -> None:
        func = node.func
        qualified = self.qualified(func)
        method = func.attr if isinstance(func, ast.Attribute) else None
        written = ast.unparse(func)
        shown = f"{written}()" + (f" ({qualified})" if qualified and qualified != written else "")
        rule = rules.call_rule(qualified, method)
        if rule is None and method == "open" and isinstance(func, ast.Attribute):
            receiver = func.value
            if isinstance(receiver, ast.Call) and self.qualified(receiver.func) in (
                rules.PATH_CLASSES
            ):
                rule = rules.FILES
        if rule is not None:
            self.report(node, rule, shown)
            return
        if method in rules.MUTATING_METHODS and isinstance(func, ast.Attribute):
            owner = self.module_level(func.value)
            if owner is not None:
                self.report(
                    node, rules.MODULE_MUTATION, f"{written}() on module-level {owner.id!r}"
                )

    def _store(self, target: ast.expr) -> None:
        if isinstance(target, ast.Tuple | ast.List):
            for element in target.elts:
                self._store(element)
            return
        if isinstance(target, ast.Starred):
            self._store(target.value)
            return
        if isinstance(target, ast.Attribute | ast.Subscript):
            owner = self.module_level(target)
            if owner is not None:
                self.report(
                    target,
                    rules.MODULE_MUTATION,
                    f"'{ast.unparse(target)}' (module-level {owner.id!r})",
                )


def workflow_functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and any(_is_workflow_decorator(d) for d in node.decorator_list)
    ]


def analyze(tree: ast.Module, source: str, path: str) -> list[Finding]:
    """Every finding of the module's workflow functions, suppressions applied, sorted."""
    module_aliases, module_bound = _module_scope(tree)
    found: set[Finding] = set()
    for fn in workflow_functions(tree):
        found.update(_WorkflowChecker(fn, path, module_aliases, module_bound).check())
    ignored = suppressions(source)
    kept = [f for f in found if not ({f.code, ALL_CODES} & ignored.get(f.line, set()))]
    return sorted(kept)
