"""The Vercel Workflow Python SDK's side of the scenarios, on its local World in process.

The local World keeps runs under ``WORKFLOW_LOCAL_DATA_DIR`` and its queue
embedded in the process (``vercel.queue.embedded``), so every scenario runs in
this one process. ``Run.return_value()`` polls once a second, so a run counts
as ended when its body marks its end (or join).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks import probe, scenarios
from benchmarks.processes import Worker, python
from benchmarks.systems import Unsupported

NO_RECOVERY = (
    "the local World's queue lives in the process's memory (vercel.queue.embedded, "
    "payloads in a temporary directory): after kill -9 a new process on the same data "
    "directory starts with an empty queue and nothing re-queues the run"
)


class Driver:
    async def start(self, workflow: str, *args: Any) -> str:
        from vercel.workflow import start

        from benchmarks.systems.vercel_app import WORKFLOWS

        await start(WORKFLOWS[workflow], *args)
        return str(args[0])

    async def wait(self, key: str) -> None:
        await scenarios.wait_marked(key)


async def _start_chain(key: str, steps: int) -> None:
    await Driver().start("chain", key, steps)


async def _recovery(params: dict[str, Any]) -> scenarios.Metrics:
    """Tried, not assumed: kill -9 the process in a step, start another on the same data."""
    workdir = Path(params["workdir"])
    probe_file = workdir / "recovery.marks"
    env = {probe.PROBE_FILE_ENV: str(probe_file)}
    processes: list[Worker] = []
    serial = iter(range(1, 1000))

    async def process(*argv: str, **extra: str) -> Worker:
        log = workdir / f"vercel{next(serial)}.log"
        command = python("-m", "benchmarks.systems.vercel_bench", *argv)
        return await Worker.start(command, {**env, **extra}, log, vercel_app_ready())

    async def start_workers() -> list[Worker]:
        processes.clear()
        return processes

    async def start_run(key: str) -> None:
        args = (key, str(scenarios.CRASH_STEPS), str(scenarios.HANG_AT))
        processes.append(await process(*args, BENCH_HANG="1"))

    wait = params["recovery"]["vercel_wait_seconds"]
    try:
        return await scenarios.recovery(
            kills=1, probe_file=probe_file, start_workers=start_workers,
            replace=process, start_run=start_run, timeout=wait,
        )  # fmt: skip
    except TimeoutError:
        raise Unsupported(
            f"{NO_RECOVERY} (tried: the step did not start again within {wait:g} s)"
        ) from None


def vercel_app_ready() -> str:
    from benchmarks.systems.vercel_app import READY

    return READY


async def run(scenario: str, params: dict[str, Any]) -> dict[str, Any]:
    os.environ["WORKFLOW_LOCAL_DATA_DIR"] = str(Path(params["workdir"]) / "workflow-data")
    if scenario == "recovery":
        return {"metrics": await _recovery(params), "notes": []}
    from vercel.workflow._internal import world

    driver = Driver()
    try:
        if scenario == "ttfs":
            metrics = await scenarios.ttfs(driver, params)
        elif scenario == "stso":
            metrics = await scenarios.stso(driver, params)
        elif scenario == "fanout":
            metrics = await scenarios.fanout(driver, params)
        elif scenario == "throughput":
            metrics = await scenarios.throughput(
                _start_chain, lambda: probe.MARKS, params["throughput"]
            )
        else:
            raise Unsupported(f"no scenario {scenario!r}")
    finally:
        with contextlib.suppress(Exception):
            await world.get_world().aclose()  # type: ignore[attr-defined]
    return {"metrics": metrics, "notes": ["local World, its embedded queue, in process"]}


if __name__ == "__main__":
    from benchmarks.systems import vercel_app

    asyncio.run(vercel_app.serve(sys.argv[1:]))
