"""What a deployment serves, as data: its workflows and their parameters.

A worker records its app's catalogue when it registers its deployment, so a
client without the code (the Kubernetes operator) can refuse a start naming an
unknown workflow, or arguments its signature cannot take, before anything is
recorded. The CLI checks arguments against the function itself, through the
same ``check_arguments``.
"""

from __future__ import annotations

import inspect
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


def describe(fns: Mapping[str, Callable[..., Any]]) -> dict[str, JsonValue]:
    """``{name: {"params": [{"name", "kind", "required"}, ...]}}`` for these functions.

    A function whose signature cannot be read is listed with ``"params": None``
    (its arguments are not checked).
    """
    described: dict[str, JsonValue] = {}
    for name, fn in sorted(fns.items()):
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):
            described[name] = {"params": None}
            continue
        described[name] = {
            "params": [
                {
                    "name": p.name,
                    "kind": p.kind.name,
                    "required": p.default is inspect.Parameter.empty
                    and p.kind
                    not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD),
                }
                for p in signature.parameters.values()
            ]
        }
    return described


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
