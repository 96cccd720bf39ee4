"""treadle's benchmark workflows: the same shapes every peer runs.

Loaded in the measuring process (in-process worker) and by ``treadle worker
benchmarks.systems.treadle_app`` (throughput and recovery on worker processes).
The World is the one ``TREADLE_WORLD`` names, set by the child before the app opens.
"""

from __future__ import annotations

import asyncio
import os

from benchmarks import probe
from treadle import Workflows, step_metadata

app = Workflows()

# Recovery: the step that hangs on its first attempt, so the worker can be killed inside it.
HANG_SECONDS = 3600.0


@app.step
async def noop(key: str, i: int) -> int:
    probe.mark(key, i)
    return i


@app.step(max_retries=3)
async def hang_once(key: str, i: int) -> int:
    """A no-op whose first attempt hangs (the worker is killed in it); later ones return."""
    probe.mark(key, f"{i}.{os.getpid()}")
    if step_metadata().attempt == 1:
        await asyncio.sleep(HANG_SECONDS)
    return i


@app.workflow
async def chain(key: str, n: int) -> int:
    """n sequential no-op steps (STSO, TTFS with n=1, throughput)."""
    for i in range(n):
        await noop(key, i)
    probe.end(key)
    return n


@app.workflow
async def fanout(key: str, n: int) -> int:
    """n no-op steps in one gather, then the join."""
    results = await asyncio.gather(*(noop(key, i) for i in range(n)))
    probe.join(key)
    return len(results)


@app.workflow
async def crash_chain(key: str, n: int, hang_at: int) -> int:
    """n sequential steps; step ``hang_at`` hangs on its first attempt (recovery)."""
    for i in range(n):
        if i == hang_at:
            await hang_once(key, i)
        else:
            await noop(key, i)
    probe.end(key)
    return n
