"""Checks the audit tests share: the log checker and a cold replay of a finished run.

``assert_sound(run)`` fails on any ``treadle.world.logcheck`` problem (dense slots,
the fence's arithmetic, one terminal event, one outcome per step, one completion
per wait). ``cold_outcome(flow, log)`` replays the whole log in a fresh Replay,
as a new delivery would, and returns what the workflow comes to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from treadle.client import Run
from treadle.replay import engine
from treadle.sdk import functions
from treadle.world import events, logcheck


async def assert_sound(run: Run) -> list[events.LoggedEvent]:
    log = await run.events()
    assert logcheck.problems(await run.get(), log) == []
    return log


def cold_outcome(
    flow: functions.WorkflowFunction[Any, Any], log: Sequence[events.LoggedEvent]
) -> Any:
    """The outcome of a cold replay of ``log``: ("completed", value) or ("failed", type)."""
    created = log[0].event
    assert isinstance(created, events.RunCreated)
    args, kwargs = functions.decode_arguments(created.input)
    replay = engine.Replay(
        run_id=log[0].run_id,
        workflow_name=flow.name,
        workflow=flow.fn,
        args=args,
        kwargs=kwargs,
    )
    try:
        for logged in log:
            if logged.type in events.RUN_TERMINAL_TYPES:
                break  # what the code comes to, from the events before the run's end
            replay.feed(logged)
        outcome = replay.advance()
    finally:
        replay.close()
    match outcome:
        case engine.Completed(value=value):
            return ("completed", value)
        case engine.Failed(error=error):
            return ("failed", type(error).__name__)
        case engine.Ended():
            return ("ended",)
    return ("other", type(outcome).__name__)


def types(log: Sequence[events.LoggedEvent]) -> list[str]:
    return [e.type for e in log]
