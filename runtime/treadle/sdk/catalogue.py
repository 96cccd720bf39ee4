"""What a deployment serves, as data: its workflows and their parameters.

A worker records its app's catalogue when it registers its deployment, so a
client without the code (the Kubernetes operator) can refuse a start naming an
unknown workflow, or arguments its signature cannot take, before anything is
recorded. The CLI checks arguments against the function itself, through the
same ``check_arguments``.

An entry also carries the workflow's compatibility tag when it declares one
(``@app.workflow(compatible="orders-v3")``, checked by ``check_compatible_tag``):
``treadle.moves`` moves a run between two revisions only when both entries carry
the same tag (``compatible_of``).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import JsonValue

_KINDS = {
    kind.name: kind
    for kind in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
        inspect.Parameter.KEYWORD_ONLY,
        inspect.Parameter.VAR_KEYWORD,
    )
}


MAX_TAG_LENGTH = 63
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_compatible_tag(workflow: str, tag: object) -> str | None:
    """``tag`` when it is a valid compatibility tag (or None); else a ValueError naming it."""
    if tag is None:
        return None
    if not isinstance(tag, str) or not tag or len(tag) > MAX_TAG_LENGTH or not _TAG.match(tag):
        raise ValueError(
            f"workflow {workflow}: compatible={tag!r} is not a compatibility tag (1 to "
            f"{MAX_TAG_LENGTH} letters, digits, '.', '_' or '-', starting with a letter or digit)"
        )
    return tag


def compatible_of(entry: JsonValue) -> str | None:
    """The compatibility tag a catalogue entry declares; None when it declares none."""
    tag = entry.get("compatible") if isinstance(entry, dict) else None
    return tag if isinstance(tag, str) and tag else None


def describe(
    fns: Mapping[str, Callable[..., Any]], compatible: Mapping[str, str | None] | None = None
) -> dict[str, JsonValue]:
    """``{name: {"params": [{"name", "kind", "required"}, ...]}}`` for these functions,
    with ``"compatible": tag`` for each one ``compatible`` gives a tag.

    A function whose signature cannot be read is listed with ``"params": None``
    (its arguments are not checked).
    """
    described: dict[str, JsonValue] = {}
    tags = compatible or {}
    for name, fn in sorted(fns.items()):
        entry = _entry(fn)
        tag = tags.get(name)
        if tag:
            entry["compatible"] = tag
        described[name] = entry
    return described


def _entry(fn: Callable[..., Any]) -> dict[str, JsonValue]:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return {"params": None}
    return {
        "params": [
            {
                "name": p.name,
                "kind": p.kind.name,
                "required": p.default is inspect.Parameter.empty
                and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD),
            }
            for p in signature.parameters.values()
        ]
    }


def signature_of(entry: JsonValue) -> inspect.Signature | None:
    """The signature a catalogue entry describes; ``None`` when it cannot say."""
    params = entry.get("params") if isinstance(entry, dict) else None
    if not isinstance(params, list):
        return None
    built = []
    for param in params:
        if not isinstance(param, dict):
            return None
        kind = _KINDS.get(str(param.get("kind")))
        if kind is None:
            return None
        default = inspect.Parameter.empty if param.get("required", True) else None
        if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            default = inspect.Parameter.empty
        built.append(inspect.Parameter(str(param.get("name")), kind, default=default))
    try:
        return inspect.Signature(built)
    except ValueError:
        return None


def check_arguments(
    signature: inspect.Signature | None, args: list[Any], kwargs: Mapping[str, Any]
) -> str | None:
    """Why ``signature`` cannot take these arguments, or ``None`` when it can."""
    if signature is None:
        return None
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        return str(exc)
    return None


def signature_of_function(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None
