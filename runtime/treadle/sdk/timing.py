"""Durable time in workflow code: ``sleep`` and ``now``."""

from __future__ import annotations

import asyncio
from datetime import datetime

from treadle import clock
from treadle.sdk import context
from treadle.sdk.durations import Duration, to_seconds


async def sleep(duration: Duration | None = None, *, until: datetime | None = None) -> None:
    """Sleep durably: a wait in the log, survived by crashes and redeploys.

    ``duration`` is seconds, a timedelta, or text like ``"1h 30m"``; or pass
    ``until=`` an aware datetime. Outside a workflow it is ``asyncio.sleep``.
    """
    if (duration is None) == (until is None):
        raise ValueError("sleep() takes a duration or until=, exactly one of them")
    replay = context.current_replay()
    loop = asyncio.get_running_loop()
    if until is not None:
        if until.tzinfo is None:
            raise ValueError("sleep(until=...) needs an aware datetime (with a timezone)")
        seconds = (
            max(until.timestamp() - loop.time(), 0.0)
            if replay
            else max(until.timestamp() - clock.now(), 0.0)
        )
    else:
        assert duration is not None
        seconds = to_seconds(duration, what="sleep duration")
    if seconds <= 0:
        return
    await asyncio.sleep(seconds)


def now() -> datetime:
    """The workflow clock: the time of the last event the replay consumed.

    Stable across replays. Outside a workflow, the current UTC time.
    """
    replay = context.current_replay()
    if replay is None:
        return clock.utcnow()
    return replay.now()
