"""What a WorkflowRun may be: the admission rules, pure (no I/O), one place.

``webhook`` calls ``review`` for every CREATE and UPDATE of a WorkflowRun the
API server sends it; ``runs.start`` calls ``spec_problems`` again before it
records anything, so the rules hold with the webhook turned off too (a refusal
then ends the object ``Failed`` instead of refusing the write).
docs/operator-admission.md is the user's version of this module.

- Immutable once the run started (``started``: ``status.runId`` set, a phase past
  Pending, or a mirrored run's annotation): ``spec.deployment``, ``spec.workflow``,
  ``spec.input``, ``spec.inputFrom``, ``spec.runKey`` (``IMMUTABLE``). Editable
  always: ``spec.cancel`` (false to true only, once started),
  ``spec.ttlSecondsAfterFinished``, ``spec.onDelete``, labels, annotations.
- ``spec.input`` is an object, an array or absent; at most ``INLINE_INPUT_LIMIT``
  bytes as compact JSON (the World's start-message limit, 128 KiB: an inline input
  lives in etcd, and ``kubectl apply`` keeps a second copy in an annotation, 256 KiB
  in all); within the engine's value limits (depth, NUL, huge integers).
- At most one of ``spec.input`` and ``spec.inputFrom``; ``inputFrom`` names exactly
  one of ``configMapKeyRef`` and ``secretKeyRef``.
"""

from __future__ import annotations

import json
from typing import Any, Final

from treadle import errors as engine_errors
from treadle import limits
from treadle.world import constants

INLINE_INPUT_LIMIT: Final = constants.MAX_MESSAGE_BYTES
IMMUTABLE: Final = ("deployment", "workflow", "input", "inputFrom", "runKey")
MIRRORED: Final = "treadle.dev/mirrored-run"
BOTH_INPUTS: Final = (
    "spec.input and spec.inputFrom are both set: give the input inline or from a "
    "ConfigMap/Secret, not both"
)
_REFS: Final = ("configMapKeyRef", "secretKeyRef")
_JSON_TYPES: Final = {str: "string", int: "number", float: "number", bool: "boolean"}


def input_size(value: Any) -> int:
    """``value``'s size as compact JSON, in bytes of UTF-8 (what the World stores)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def started(obj: dict[str, Any] | None) -> str | None:
    """The run an object started (its id, or ``"claimed"``), or ``None`` when not yet."""
    if not obj:
        return None
    status = obj.get("status") or {}
    if status.get("runId"):
        return str(status["runId"])
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    if annotations.get(MIRRORED):
        return str(annotations[MIRRORED])
    if status.get("phase") not in (None, "", "Pending"):
        return "claimed"
    return None


def spec_problems(spec: dict[str, Any]) -> list[str]:
    """What is wrong with a WorkflowRun's spec on its own, one line each (field first)."""
    problems: list[str] = []
    has_input = spec.get("input") is not None
    source = spec.get("inputFrom")
    if has_input and source is not None:
        problems.append(BOTH_INPUTS)
    if source is not None:
        refs = [ref for ref in _REFS if (source or {}).get(ref) is not None]
        if len(refs) != 1:
            named = " and ".join(f"spec.inputFrom.{ref}" for ref in refs) or "neither"
            problems.append(
                "spec.inputFrom must name exactly one of configMapKeyRef and secretKeyRef, "
                f"not {named}"
            )
    if has_input:
        problems.extend(input_problems(spec["input"]))
    return problems


def input_problems(value: Any, where: str = "spec.input") -> list[str]:
    """Why ``value`` cannot be a run's input (shape, engine limits), or nothing.

    ``where`` names it: ``spec.input``, or the ConfigMap/Secret key it came from.
    """
    if value is None:
        return []
    if not isinstance(value, dict | list):
        kind = _JSON_TYPES.get(type(value), type(value).__name__)
        return [
            f"{where} must be an object (keyword arguments) or an array (positional ones), "
            f"not a {kind}"
        ]
    try:  # the engine's checks (depth, NUL, lone surrogates, huge ints), before any size
        limits.check_value(value, where)
    except engine_errors.SerializationError as exc:
        return [str(exc)]
    return []


def inline_size_problem(value: Any) -> str | None:
    """An inline ``spec.input`` over ``INLINE_INPUT_LIMIT``, with both sizes named."""
    if value is None:
        return None
    size = input_size(value)
    if size <= INLINE_INPUT_LIMIT:
        return None
    return (
        f"spec.input is {size:,} bytes as JSON, over the {INLINE_INPUT_LIMIT:,}-byte "
        f"({INLINE_INPUT_LIMIT // 1024} KiB) limit of an inline input: put it in a ConfigMap "
        "or Secret and name it in spec.inputFrom"
    )


def update_problems(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Why an UPDATE from ``old`` to ``new`` is refused (the spec fields it touches)."""
    run = started(old)
    if run is None:
        return []
    before, after = old.get("spec") or {}, new.get("spec") or {}
    problems = [
        f"spec.{name} is immutable once the run started (run {run}); "
        "create a WorkflowRun of another name (or spec.runKey) for another run"
        for name in IMMUTABLE
        if before.get(name) != after.get(name)
    ]
    if before.get("cancel") and not after.get("cancel"):
        problems.append(
            f"spec.cancel cannot go back to false: the run {run} was asked to cancel, and a "
            "cancel is not undone"
        )
    return problems


def review(operation: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> list[str]:
    """Every reason to refuse this CREATE or UPDATE of a WorkflowRun (empty: allowed)."""
    if new is None or operation not in ("CREATE", "UPDATE"):
        return []
    spec = new.get("spec") or {}
    problems: list[str] = []
    if operation == "UPDATE" and old is not None:
        problems.extend(update_problems(old, new))
        before = old.get("spec") or {}
        if all(spec.get(name) == before.get(name) for name in ("input", "inputFrom")):
            # Its input untouched (an edit of a mutable field, the operator's finalizer or
            # labels), an object admitted before these rules, or with the webhook off, is
            # not refused for it: runs.start already judged (or will judge) that input.
            return problems
    problems.extend(spec_problems(spec))
    size = inline_size_problem(spec.get("input"))
    if size is not None:
        problems.append(size)
    return problems
