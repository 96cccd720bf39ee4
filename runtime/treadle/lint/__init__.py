"""``treadle lint``: a determinism linter over workflow code (issue 17 item 9).

Workflow code is replayed from the log, so it must decide the same way on every replay
(seed 003: "the analyzer reports common violations"). The linter reads sources with
``ast`` (it never imports them) and reports, inside functions decorated as workflows,
the calls and statements that break that: the real clock, real randomness, ids made
from either, real sleeps, network, file and process I/O, threads and executors, and
state shared through globals or module-level objects. Each finding carries the file,
line and column, a rule code (``treadle.lint.rules``) and what to write instead; a
``# treadle: ignore[CODE]`` comment on the line drops it.

- ``lint_source(source, path)``: the findings of one source text;
- ``lint_paths(paths)``: of files and directories (every ``*.py`` under one, hidden
  directories and ``__pycache__`` left out); ``LintInputInvalid`` for a path that does
  not exist, a file that is not UTF-8 or does not parse (one line naming file and line);
- ``lint_loaded(workflows)``: the worker's check when it loads an app (``onload``).

Used by ``treadle.cli.lintcmd`` and ``treadle.lint.onload``; see docs/lint.md.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

from treadle import errors
from treadle.lint.analyzer import Finding, analyze
from treadle.lint.rules import ALL_RULES, BY_CODE, Rule

__all__ = ["ALL_RULES", "BY_CODE", "Finding", "Rule", "lint_paths", "lint_source"]

_SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "site-packages"})


def lint_source(source: str, path: str = "<string>") -> list[Finding]:
    """The findings of one module's source; ``LintInputInvalid`` when it does not parse."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise errors.LintInputInvalid(path, f"syntax error: {exc.msg}", line=exc.lineno) from None
    except ValueError as exc:  # a NUL byte in the source
        raise errors.LintInputInvalid(path, f"cannot be parsed: {exc}") from None
    return analyze(tree, source, path)


def _files(paths: Iterable[str]) -> Iterator[Path]:
    for given in paths:
        path = Path(given)
        if not path.exists():
            raise errors.LintInputInvalid(given, "no such file or directory")
        if path.is_dir():
            for found in sorted(path.rglob("*.py")):
                parts = found.relative_to(path).parts[:-1]
                if any(p.startswith(".") or p in _SKIPPED_DIRS for p in parts):
                    continue
                yield found
        else:
            yield path


def read_source(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise errors.LintInputInvalid(str(path), f"is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise errors.LintInputInvalid(str(path), exc.strerror or str(exc)) from None


def lint_paths(paths: Iterable[str]) -> tuple[list[Finding], int]:
    """Every finding under ``paths`` (sorted), and how many files were read."""
    findings: list[Finding] = []
    count = 0
    for path in _files(paths):
        count += 1
        findings += lint_source(read_source(path), str(path))
    return sorted(findings), count
