"""treadle's benchmark workflows: ``benchmarks.shapes`` in treadle's decorators.

Loaded in the measuring process (in-process worker) and by ``treadle worker
benchmarks.systems.treadle_app`` (throughput and recovery on worker processes).
The World is the one ``TREADLE_WORLD`` names, set by the child before the app opens.
"""

from __future__ import annotations

from datetime import UTC, datetime

from benchmarks import shapes
from treadle import Workflows, create_hook, sleep, step_metadata

app = Workflows()


@app.step
async def noop(key: str, i: int) -> int:
    return await shapes.noop(key, i)


@app.step(max_retries=3)
async def hang_once(key: str, i: int) -> int:
    return await shapes.hang(key, i, first_attempt=step_metadata().attempt == 1)


@app.workflow
async def chain(key: str, n: int) -> int:
    return await shapes.chain(noop, key, n)


@app.workflow
async def fanout(key: str, n: int) -> int:
    return await shapes.fanout(noop, key, n)


@app.workflow
async def crash_chain(key: str, n: int, hang_at: int) -> int:
    return await shapes.crash_chain(noop, hang_once, key, n, hang_at)


async def _sleep_until(due: float) -> None:
    await sleep(until=datetime.fromtimestamp(due, UTC))


async def _wait(token: str) -> object:
    return await create_hook(token).payload()


@app.workflow
async def sleeper(key: str, due: float) -> int:
    return await shapes.sleeper(noop, _sleep_until, key, due)


@app.workflow
async def history(key: str, n: int, waits: int) -> int:
    return await shapes.history(noop, _wait, key, n, waits)
