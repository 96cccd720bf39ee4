"""DBOS's benchmark workflows (the shapes treadle's app has), and a DBOS worker process.

``configure(url, executor_id)`` creates the DBOS instance on a system database;
``python -m benchmarks.systems.dbos_app URL EXECUTOR_ID`` launches one that
serves the benchmark queue until SIGTERM (throughput and recovery). With
``BENCH_HANG`` set, ``hang_once`` hangs, so the process can be killed inside it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

from dbos import DBOS, DBOSConfig

from benchmarks import shapes

QUEUE = "bench"
# The DBOS figures use a 10 ms queue poll (DBOS's default is 1 s).
QUEUE_POLL_SECONDS = 0.01
READY = "dbos worker ready"
HANG_ENV = "BENCH_HANG"


@DBOS.step()
async def noop(key: str, i: int) -> int:
    return await shapes.noop(key, i)


@DBOS.step()
async def hang_once(key: str, i: int) -> int:
    return await shapes.hang(key, i, first_attempt=bool(os.environ.get(HANG_ENV)))


@DBOS.workflow()
async def chain(key: str, n: int) -> int:
    return await shapes.chain(noop, key, n)


@DBOS.workflow()
async def fanout(key: str, n: int) -> int:
    return await shapes.fanout(noop, key, n)


@DBOS.workflow()
async def crash_chain(key: str, n: int, hang_at: int) -> int:
    return await shapes.crash_chain(noop, hang_once, key, n, hang_at)


async def _sleep_until(due: float) -> None:
    await DBOS.sleep_async(max(due - time.time(), 0.0))


async def _wait(topic: str) -> object:
    return await DBOS.recv_async(topic, timeout_seconds=600)


@DBOS.workflow()
async def sleeper(key: str, due: float) -> int:
    return await shapes.sleeper(noop, _sleep_until, key, due)


@DBOS.workflow()
async def history(key: str, n: int, waits: int) -> int:
    return await shapes.history(noop, _wait, key, n, waits)


WORKFLOWS: dict[str, Callable[..., Coroutine[Any, Any, int]]] = {
    "chain": chain,
    "fanout": fanout,
    "crash_chain": crash_chain,
    "sleeper": sleeper,
    "history": history,
}


def configure(url: str, executor_id: str = "local") -> None:
    config: DBOSConfig = {
        "name": "bench",
        "system_database_url": url,
        "executor_id": executor_id,
        "log_level": "WARNING",
        "application_version": "bench",
    }
    DBOS(config=config)


async def serve(url: str, executor_id: str) -> None:
    configure(url, executor_id)
    DBOS.launch()
    await DBOS.register_queue_async(QUEUE, polling_interval_sec=QUEUE_POLL_SECONDS)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(READY, file=sys.stderr, flush=True)
    await stop.wait()
    DBOS.destroy(workflow_completion_timeout_sec=1)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2]))
