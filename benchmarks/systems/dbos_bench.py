"""DBOS's side of the scenarios, on the harness's PostgreSQL (a system database of its own).

TTFS is measured twice: through a DBOS queue polled every 10 ms (``ttfs_ms``,
the counterpart of treadle's start through its queue) and started in process
with ``DBOS.start_workflow_async`` (``ttfs_direct_ms``). STSO and fan-out start
in process. Throughput: 2 DBOS processes serve the queue, this process enqueues
with ``DBOSClient``. Recovery: kill -9 of the DBOS process inside a step, then
a new process with the same executor id, which recovers the run at launch (a
DBOS app without Conductor has no other way to take a dead executor's runs).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

from benchmarks import probe, scale, scenarios, servers
from benchmarks.processes import Worker, python
from benchmarks.systems import Unsupported, dbos_app


class Direct:
    """Starts in process; a run has ended when it marks so (``get_result`` polls)."""

    async def start(self, workflow: str, *args: Any) -> str:
        from dbos import DBOS

        await DBOS.start_workflow_async(dbos_app.WORKFLOWS[workflow], *args)
        return str(args[0])

    async def wait(self, key: str) -> None:
        await scenarios.wait_marked(key)


class Queued(Direct):
    def __init__(self, queue: Any) -> None:
        self.queue = queue

    async def start(self, workflow: str, *args: Any) -> str:
        await self.queue.enqueue_async(dbos_app.WORKFLOWS[workflow], *args)
        return str(args[0])


async def _in_process(scenario: str, url: str, params: dict[str, Any]) -> scenarios.Metrics:
    from dbos import DBOS

    dbos_app.configure(url)
    DBOS.launch()
    try:
        if scenario == "ttfs":
            queue = await DBOS.register_queue_async(
                dbos_app.QUEUE, polling_interval_sec=dbos_app.QUEUE_POLL_SECONDS
            )
            return {
                **await scenarios.ttfs(Queued(queue), params),
                **await scenarios.ttfs(Direct(), params, name="ttfs_direct_ms"),
            }
        if scenario == "stso":
            return await scenarios.stso(Direct(), params)
        return await scenarios.fanout(Direct(), params)
    finally:
        DBOS.destroy(workflow_completion_timeout_sec=1)


class Processes:
    """DBOS worker processes on one system database, marks to ``probe_file``."""

    def __init__(self, url: str, workdir: Path, probe_file: Path) -> None:
        self.url = url
        self.workdir = workdir
        self.env = {probe.PROBE_FILE_ENV: str(probe_file)}
        self.serial = itertools.count(1)

    async def start(self, executor_id: str, **env: str) -> Worker:
        argv = python("-m", "benchmarks.systems.dbos_app", self.url, executor_id)
        log = self.workdir / f"dbos{next(self.serial)}.log"
        return await Worker.start(argv, {**self.env, **env}, log, dbos_app.READY)


async def _client(url: str) -> Any:
    from dbos import DBOSClient

    return DBOSClient(system_database_url=url, application_name="bench")


def _options(workflow: str) -> Any:
    return {"queue_name": dbos_app.QUEUE, "workflow_name": workflow, "app_version": "bench"}


async def _throughput(url: str, params: dict[str, Any]) -> scenarios.Metrics:
    workdir = Path(params["workdir"])
    probe_file = workdir / "throughput.marks"
    processes = Processes(url, workdir, probe_file)
    workers = [await processes.start(f"w{i}") for i in range(params["workers"])]
    client = await _client(url)

    async def start(key: str, steps: int) -> None:
        await client.enqueue_async(_options("chain"), key, steps)

    try:
        return await scenarios.throughput(
            start, lambda: probe.read_file(probe_file), params["throughput"]
        )
    finally:
        client.destroy()
        for worker in workers:
            await worker.stop()


async def _recovery(url: str, params: dict[str, Any]) -> scenarios.Metrics:
    workdir = Path(params["workdir"])
    probe_file = workdir / "recovery.marks"
    processes = Processes(url, workdir, probe_file)
    # The first launch migrates the system database, which the client needs.
    await (await processes.start("setup")).stop()
    client = await _client(url)

    async def start_workers() -> list[Worker]:
        return [await processes.start("rec", **{dbos_app.HANG_ENV: "1"})]

    async def start_run(key: str) -> None:
        await client.enqueue_async(
            _options("crash_chain"), key, scenarios.CRASH_STEPS, scenarios.HANG_AT
        )

    try:
        return await scenarios.recovery(
            kills=params["recovery"]["kills"],
            probe_file=probe_file,
            start_workers=start_workers,
            replace=lambda: processes.start("rec"),
            start_run=start_run,
            timeout=120,
        )
    finally:
        client.destroy()


async def run(scenario: str, params: dict[str, Any]) -> dict[str, Any]:
    if scenario in scale.SCENARIOS:  # issue 15 item 5: benchmarks.systems.dbos_scale
        from benchmarks.systems import dbos_scale

        return await dbos_scale.run(scenario, params)
    url = await servers.fresh_database(params["pg_admin_dsn"], "dbos")
    notes: list[str] = []
    if scenario in ("ttfs", "stso", "fanout"):
        metrics = await _in_process(scenario, url, params)
        notes.append(
            "TTFS through a DBOS queue polled every 10 ms (ttfs_ms) and started in process "
            "(ttfs_direct_ms)"
            if scenario == "ttfs"
            else "started in process (DBOS.start_workflow_async)"
        )
    elif scenario == "throughput":
        # The enqueue waits for workers that launched first, so the schema exists.
        metrics = await _throughput(url, params)
        notes.append(f"{params['workers']} DBOS processes serve a queue polled every 10 ms")
    elif scenario == "recovery":
        metrics = await _recovery(url, params)
        notes.append(
            "kill -9 of the DBOS process; a new one with the same executor id recovers the "
            "run at launch (its start counts)"
        )
    else:
        raise Unsupported(f"no scenario {scenario!r}")
    os.environ.pop(probe.PROBE_FILE_ENV, None)
    return {"metrics": metrics, "notes": notes}
