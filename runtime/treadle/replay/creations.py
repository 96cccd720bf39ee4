"""The creations the log records, by position: what replay matches the code against.

A creation event (``step_created``, an inline ``step_started``, ``wait_created``,
``hook_created`` or ``hook_conflict``, ``attr_set``, ``child_created``) records the
kind and name of the operation at its position (``creation``); ``Recorded`` is one,
indexed by ``Replay.feed``, and ``name_of`` is the name the code reached there. A
position where the two disagree is a divergence, described by both sides.

Called by ``replay.engine``.
"""

from __future__ import annotations

from dataclasses import dataclass

from treadle.replay import operations
from treadle.world import events


@dataclass(frozen=True)
class Recorded:
    """A creation event, indexed by position."""

    kind: operations.Kind
    name: str
    correlation_id: str
    slot: int

    def describe(self) -> str:
        if self.kind == "attr":
            return f"attribute {self.name!r}"
        if self.kind == "child":
            return f"child workflow {self.name}"
        return (
            f"step {self.name}"
            if self.kind == "step"
            else (f"hook {self.name!r}" if self.kind == "hook" else "a sleep")
        )


def name_of(op: operations.Operation) -> str:
    if isinstance(op, operations.StepCall):
        return op.step_name
    if isinstance(op, operations.HookWait):
        return op.token
    if isinstance(op, operations.AttrWrite):
        return op.key
    if isinstance(op, operations.ChildCall):
        return op.workflow_name
    return ""


def creation(event: events.Event) -> tuple[operations.Kind, str] | None:
    match event:
        case events.StepCreated(step_name=name, position=p) if p is not None:
            return "step", name
        case events.StepStarted(step_name=name, position=p) if p is not None:
            return "step", name
        case events.WaitCreated(position=p) if p is not None:
            return "wait", ""
        case events.HookCreated(token=token, position=p) if p is not None:
            return "hook", token
        case events.HookConflict(token=token, position=p) if p is not None:
            return "hook", token
        case events.AttrSet(key=key, position=p) if p is not None:
            return "attr", key
        case events.ChildCreated(workflow_name=name, position=p) if p is not None:
            return "child", name
    return None
