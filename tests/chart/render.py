"""Render a Helm chart's templates without Helm, for the small subset the chart uses.

``tests/chart`` calls :func:`render_chart` to turn ``charts/treadle`` into parsed
Kubernetes objects on a machine with no ``helm`` binary. It understands exactly the
Go-template subset the chart keeps to, and refuses anything else with the file and
line, so a template that drifts outside the subset fails the test instead of being
rendered wrongly:

- actions ``{{ pipeline }}`` with ``{{-`` / ``-}}`` whitespace trimming and
  ``{{/* comments */}}``;
- operands: ``.`` and field paths (``.Values.image.tag``, ``.Release.Name``,
  ``.Chart.AppVersion``), ``$`` (the top-level context, also as ``$.Values...``:
  no other variables), string literals, integers, ``true``/``false``;
- pipelines ``a | f x`` (the piped value is the last argument);
- ``if``/``else``/``end``, ``range`` over a list (``.`` is the element),
  ``define "name"`` and ``include "name" .``;
- functions ``toYaml``, ``nindent``, ``indent``, ``quote``, ``default``, ``eq``.

Semantics follow Helm: a missing map key is empty and prints as nothing, emptiness
decides ``if`` and ``default``, ``toYaml`` drops the trailing newline, and files
whose name starts with ``_`` hold definitions only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ACTION = re.compile(r"\{\{(-(?=\s))?(.*?)((?<=\s)-)?\}\}", re.DOTALL)
WORD = re.compile(r'"(?:[^"\\]|\\.)*"|\||[^\s|]+')
FIELD_PATH = re.compile(r"^\$?(\.[A-Za-z_][A-Za-z0-9_]*)+$|^\.$|^\$$")
VARIABLE = re.compile(r"\$(?![.\s)]|$)")  # a named variable ($x), outside the subset
INTEGER = re.compile(r"^-?[0-9]+$")


class TemplateError(Exception):
    """A template uses something outside the subset, or fails to evaluate."""


@dataclass(frozen=True)
class Where:
    """A position in a template, for error messages."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class Text:
    text: str


@dataclass
class Output:
    pipeline: str
    where: Where


@dataclass
class Block:
    """``if`` or ``range``: a pipeline, a body, and what ``else`` renders."""

    keyword: str
    pipeline: str
    where: Where
    body: list[Node] = field(default_factory=list)
    otherwise: list[Node] = field(default_factory=list)
    in_else: bool = False


@dataclass
class Define:
    name: str
    where: Where
    body: list[Node] = field(default_factory=list)


Node = Text | Output | Block | Define


def parse(source: str, file: str) -> list[Node]:
    """Parse one template file into nodes; definitions stay in place as Define nodes."""
    root: list[Node] = []
    stack: list[Block | Define] = []
    position = 0

    def append(node: Node) -> None:
        if not stack:
            root.append(node)
        elif isinstance(stack[-1], Block) and stack[-1].in_else:
            stack[-1].otherwise.append(node)
        else:
            stack[-1].body.append(node)

    for match in ACTION.finditer(source):
        text = source[position : match.start()]
        if match.group(1):
            text = text.rstrip(" \t\r\n")
        append(Text(text))
        position = match.end()
        if match.group(3):
            rest = source[position:]
            position += len(rest) - len(rest.lstrip(" \t\r\n"))
        where = Where(file, source.count("\n", 0, match.start()) + 1)
        body = match.group(2).strip()
        keyword, _, argument = body.partition(" ")
        argument = argument.strip()
        if body.startswith("/*"):
            if not body.endswith("*/"):
                raise TemplateError(f"{where}: unterminated comment")
        elif keyword in ("if", "range"):
            block = Block(keyword, argument, where)
            append(block)
            stack.append(block)
        elif keyword == "define":
            definition = Define(_string_literal(argument, where), where)
            append(definition)
            stack.append(definition)
        elif body == "else":
            if not stack or not isinstance(stack[-1], Block) or stack[-1].in_else:
                raise TemplateError(f"{where}: else outside if/range")
            stack[-1].in_else = True
        elif keyword == "else":
            raise TemplateError(f"{where}: only a bare else is supported, not {body!r}")
        elif body == "end":
            if not stack:
                raise TemplateError(f"{where}: end without if/range/define")
            stack.pop()
        elif keyword in ("with", "template", "block", "break", "continue") or VARIABLE.search(body):
            raise TemplateError(f"{where}: {keyword!r} is outside the supported subset")
        else:
            append(Output(body, where))
    append(Text(source[position:]))
    if stack:
        raise TemplateError(f"{stack[-1].where}: {type(stack[-1]).__name__} is never closed")
    return root


def _string_literal(word: str, where: Where) -> str:
    if not (len(word) >= 2 and word[0] == word[-1] == '"'):
        raise TemplateError(f"{where}: expected a string literal, found {word!r}")
    value = json.loads(word)
    assert isinstance(value, str)
    return value


def _definitions(nodes: Sequence[Node], into: dict[str, Define]) -> None:
    for node in nodes:
        if isinstance(node, Define):
            if node.name in into:
                raise TemplateError(f"{node.where}: {node.name!r} is defined twice")
            into[node.name] = node
        elif isinstance(node, Block):
            _definitions(node.body, into)
            _definitions(node.otherwise, into)


def is_empty(value: Any) -> bool:
    """Go template and Sprig emptiness: nil, false, 0, and empty strings and collections."""
    if value is None or value is False:
        return True
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value == 0
    if isinstance(value, str | list | tuple | dict):
        return len(value) == 0
    return False


def _printed(value: Any, where: Where) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise TemplateError(f"{where}: printing a {type(value).__name__}; pipe it through toYaml")


def to_yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=False, sort_keys=True).rstrip("\n")


def indent(width: int, text: str) -> str:
    pad = " " * width
    return pad + text.replace("\n", "\n" + pad)


class Renderer:
    """Renders parsed templates against a context (``Values``, ``Release``, ``Chart``)."""

    def __init__(self, definitions: dict[str, Define], root: Any = None) -> None:
        self.definitions = definitions
        self.root = root  # what ``$`` is
        self.functions: dict[str, Callable[..., Any]] = {
            "toYaml": to_yaml,
            "indent": indent,
            "nindent": lambda width, text: "\n" + indent(width, text),
            "quote": lambda *values: " ".join(
                json.dumps(_printed(value, Where("quote", 0)), ensure_ascii=False)
                for value in values
                if value is not None
            ),
            "default": lambda fallback, value: fallback if is_empty(value) else value,
            "eq": lambda left, right: left == right,
            "include": self.include,
        }

    def include(self, name: str, dot: Any) -> str:
        if name not in self.definitions:
            raise TemplateError(f"include of an undefined template {name!r}")
        return self.render(self.definitions[name].body, dot)

    def render(self, nodes: Sequence[Node], dot: Any) -> str:
        out: list[str] = []
        for node in nodes:
            if isinstance(node, Text):
                out.append(node.text)
            elif isinstance(node, Output):
                out.append(_printed(self.evaluate(node.pipeline, dot, node.where), node.where))
            elif isinstance(node, Block):
                out.append(self._render_block(node, dot))
        return "".join(out)

    def _render_block(self, block: Block, dot: Any) -> str:
        value = self.evaluate(block.pipeline, dot, block.where)
        if block.keyword == "if":
            return self.render(block.otherwise if is_empty(value) else block.body, dot)
        if value is None or value == []:
            return self.render(block.otherwise, dot)
        if not isinstance(value, list):
            raise TemplateError(f"{block.where}: range over a {type(value).__name__}, not a list")
        return "".join(self.render(block.body, element) for element in value)

    def evaluate(self, pipeline: str, dot: Any, where: Where) -> Any:
        words = WORD.findall(pipeline)
        if not words or "(" in pipeline:
            raise TemplateError(f"{where}: unsupported pipeline {pipeline!r}")
        commands: list[list[str]] = [[]]
        for word in words:
            if word == "|":
                commands.append([])
            else:
                commands[-1].append(word)
        result: Any = None
        for index, command in enumerate(commands):
            if not command:
                raise TemplateError(f"{where}: empty command in {pipeline!r}")
            name, *arguments = command
            values = [self._operand(word, dot, where) for word in arguments]
            if index > 0:
                values.append(result)
            if name in self.functions:
                try:
                    result = self.functions[name](*values)
                except TypeError as error:
                    raise TemplateError(f"{where}: {name}: {error}") from error
            elif values:
                raise TemplateError(f"{where}: {name!r} is not a supported function")
            else:
                result = self._operand(name, dot, where)
        return result

    def _operand(self, word: str, dot: Any, where: Where) -> Any:
        if word.startswith('"'):
            return _string_literal(word, where)
        if word in ("true", "false"):
            return word == "true"
        if INTEGER.match(word):
            return int(word)
        if not FIELD_PATH.match(word):
            raise TemplateError(f"{where}: {word!r} is outside the supported subset")
        value = self.root if word.startswith("$") else dot
        for key in word.split(".")[1:] if word not in (".", "$") else []:
            if not isinstance(value, Mapping):
                raise TemplateError(f"{where}: {word}: nil pointer evaluating .{key}")
            value = value.get(key)
        return value


def render_template(source: str, dot: Any, file: str = "inline") -> str:
    """Render one template on its own, its own definitions available to ``include``."""
    nodes = parse(source, file)
    definitions: dict[str, Define] = {}
    _definitions(nodes, definitions)
    return Renderer(definitions, root=dot).render(nodes, dot)


def merge_values(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's coalescing: maps merge key by key, anything else replaces, null deletes."""
    merged = dict(base)
    for key, value in overrides.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_values(merged[key], value)
        else:
            merged[key] = value
    return merged


@dataclass(frozen=True)
class Manifest:
    """One rendered Kubernetes object and the template it came from."""

    source: str
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body["kind"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])


def chart_values(chart: Path, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The chart's ``values.yaml`` with ``overrides`` merged over it."""
    defaults = yaml.safe_load((chart / "values.yaml").read_text()) or {}
    return merge_values(defaults, overrides or {})


def render_chart(
    chart: Path,
    overrides: Mapping[str, Any] | None = None,
    *,
    release: str = "treadle",
    namespace: str = "treadle-system",
) -> list[Manifest]:
    """Render every template of ``chart`` and parse each YAML document it produces."""
    metadata = yaml.safe_load((chart / "Chart.yaml").read_text())
    context = {
        "Values": chart_values(chart, overrides),
        "Release": {"Name": release, "Namespace": namespace, "Service": "Helm"},
        "Chart": {key[:1].upper() + key[1:]: str(value) for key, value in metadata.items()},
    }
    templates = chart / "templates"
    parsed: dict[str, list[Node]] = {}
    definitions: dict[str, Define] = {}
    for path in sorted(templates.rglob("*")):
        if path.is_file() and path.name != "NOTES.txt":
            relative = str(path.relative_to(chart))
            parsed[relative] = parse(path.read_text(), relative)
            _definitions(parsed[relative], definitions)
    renderer = Renderer(definitions, root=context)
    manifests: list[Manifest] = []
    for relative, nodes in parsed.items():
        if Path(relative).name.startswith("_"):
            continue
        text = renderer.render(nodes, context)
        for document in re.split(r"(?m)^---\s*$", text):
            body = yaml.safe_load(document)
            if body is not None:
                manifests.append(Manifest(relative, body))
    return manifests
