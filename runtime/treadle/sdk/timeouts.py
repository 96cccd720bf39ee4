"""``treadle.timeout("10s")``: a timeout block in workflow code (docs/timeouts.md).

In a workflow it is ``asyncio.timeout`` on the replay loop, whose timers are durable
waits (``replay.loop``): the deadline is a ``wait_created`` in the log and the block
times out only where the walk reaches that wait's ``wait_completed``, so every replay
decides the same. Raw ``asyncio.timeout`` / ``asyncio.wait_for`` are the same thing;
this adds the duration forms (``"10s"``, ``"1h 30m"``, a timedelta) and a clear error
for a non-positive one. Outside a workflow it is plain ``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio

from treadle.sdk.durations import Duration, positive_seconds


def timeout(duration: Duration) -> asyncio.Timeout:
    """``async with treadle.timeout("10s"): ...``: raises ``TimeoutError`` past it."""
    return asyncio.timeout(positive_seconds(duration, what="timeout"))
