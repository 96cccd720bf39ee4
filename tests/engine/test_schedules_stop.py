"""The firing loop's ``stop`` never hangs a worker's close: a task that swallows its
cancellation (as a World client's own wait can) is cancelled again until it ends."""

from __future__ import annotations

import asyncio
from typing import Any

from treadle.schedules.loop import FiringLoop


async def test_stop_cancels_again_a_task_that_swallowed_its_cancellation() -> None:
    loop = FiringLoop(None, None, None, serves=set(), rescan_seconds=10)  # type: ignore[arg-type]
    swallowed = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.set()  # the first cancellation absorbed; the task goes on
        await asyncio.sleep(3600)

    task: Any = asyncio.create_task(stubborn())
    await asyncio.sleep(0)  # the task is inside its first sleep
    loop._task = task
    clock = asyncio.get_running_loop()
    began = clock.time()
    # An unbounded await of the task would hang here: the deadline ends it (after the
    # old stop swallowed the deadline's own cancellation) and the check below fails.
    async with asyncio.timeout(20):
        await loop.stop()
    assert clock.time() - began < 10, "stop waited on the task instead of cancelling it again"
    assert swallowed.is_set() and task.cancelled()
