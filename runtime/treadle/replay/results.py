"""How a result the walk reaches resolves the operation that awaits it.

A step outcome settles the step call's future (its decoded result, or ``StepFailed``),
a ``wait_completed`` fires the sleep's timer, a hook payload, conflict or force-claim
settles the hook's future, and a child's result goes to ``replay.children``. Only when
the walk reaches it, so races settle in log order on every replay. (The run timeout's
own wait is ``Replay``'s: it times the run out.)

Called by ``replay.engine``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import JsonValue

from treadle import errors, serde
from treadle.replay import children, operations
from treadle.world import events


def settle(future: asyncio.Future[Any], data: JsonValue, path: str) -> None:
    """Resolve ``future`` with the decoded value; a value that cannot be decoded (a class
    the app does not declare) is raised where the workflow awaits it, on every replay."""
    try:
        value = serde.decode(data, path)
    except errors.SerializationError as exc:
        future.set_exception(exc)
        return
    future.set_result(value)


def resolve(op: operations.Operation, event: events.Event) -> None:
    """Settle ``op`` with ``event``, its result in the log (the walk reached it)."""
    if isinstance(op, operations.StepCall):
        if op.future.done():
            return
        if isinstance(event, events.StepCompleted):
            settle(op.future, event.result, f"step {op.step_name} result")
        elif isinstance(event, events.StepFailed):
            op.future.set_exception(
                errors.StepFailed(
                    event.step_name,
                    event.error.message,
                    error_type=event.error.type,
                    code=event.error.code,
                )
            )
    elif isinstance(op, operations.Sleep):
        if isinstance(event, events.WaitCompleted) and op.timer is not None:
            op.timer.fire()
    elif isinstance(op, operations.ChildCall):
        children.resolve(op, event)
    elif isinstance(op, operations.HookWait) and not op.future.done():
        if isinstance(event, events.HookReceived):
            settle(op.future, event.payload, f"hook {op.token!r} payload")
        elif isinstance(event, events.HookConflict):
            op.future.set_exception(
                errors.HookConflictError(op.token, holder_run_id=event.holder_run_id)
            )
        elif isinstance(event, events.HookDisposed) and event.force_claimed_by:
            # Another run force-claimed the token (seed 003 "Force-claim").
            op.future.set_exception(
                errors.HookForceClaimedError(op.token, claimed_by=event.force_claimed_by)
            )
