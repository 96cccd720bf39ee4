"""DBOS's side of the scale scenarios (``benchmarks.scale``), on the harness's PostgreSQL.

``workers``, ``memory`` and ``sleepers`` run DBOS processes serving the benchmark
queue (a fresh system database for each fleet) and enqueue with ``DBOSClient``
from this process, as the throughput scenario does; ``history`` runs in process
(``DBOS.start_workflow_async``), its message from outside a ``DBOS.send`` to the
workflow's ``recv``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from benchmarks import probe, scale, scenarios, servers
from benchmarks.processes import Worker
from benchmarks.systems import Unsupported, dbos_app
from benchmarks.systems.dbos_bench import Processes, _client, _options


@contextlib.asynccontextmanager
async def _fleet(
    params: dict[str, Any], count: int, tag: str
) -> AsyncIterator[tuple[list[Worker], Any, Path, str]]:
    url = await servers.fresh_database(params["pg_admin_dsn"], "dbos")
    workdir = Path(params["workdir"])
    probe_file = workdir / f"{tag}.marks"
    processes = Processes(url, workdir, probe_file)
    workers = [await processes.start(f"{tag}-{i}") for i in range(count)]
    client = await _client(url)
    try:
        yield workers, client, probe_file, url
    finally:
        client.destroy()
        for worker in workers:
            await worker.stop()


def _enqueue(client: Any, workflow: str) -> Any:
    async def start(key: str, arg: Any) -> None:
        await client.enqueue_async(_options(workflow), key, arg)

    return start


async def _workers(params: dict[str, Any]) -> scenarios.Metrics:
    @contextlib.asynccontextmanager
    async def fleet(
        count: int,
    ) -> AsyncIterator[tuple[scale.StartChain, scale.Read, scale.Costs]]:
        async with _fleet(params, count, f"w{count}") as (running, client, marks, url):

            async def costs() -> dict[str, float]:
                out = await scale.postgres_costs(url)
                out["cpu_s"] = sum(scale.cpu_seconds(w.pid) for w in running)
                return out

            yield _enqueue(client, "chain"), lambda: probe.read_file(marks), costs

    return await scale.workers(fleet, params["workers_scale"])


async def _memory(params: dict[str, Any]) -> scenarios.Metrics:
    spec = params["memory"]
    async with _fleet(params, 1, "msleep") as ((worker,), client, marks, _):
        out = await scale.memory_sleeping(
            _enqueue(client, "sleeper"), lambda: probe.read_file(marks), worker.pid, spec
        )
    async with _fleet(params, 1, "mruns") as ((worker,), client, marks, _):
        out |= await scale.memory_runs(
            _enqueue(client, "chain"), lambda: probe.read_file(marks), worker.pid, spec
        )
    return out


async def _sleepers(params: dict[str, Any]) -> scenarios.Metrics:
    async with _fleet(params, params["workers"], "sleep") as (_, client, marks, _url):
        return await scale.sleepers(
            _enqueue(client, "sleeper"), lambda: probe.read_file(marks), params["sleepers"]
        )


async def _history(params: dict[str, Any]) -> scenarios.Metrics:
    from dbos import DBOS

    url = await servers.fresh_database(params["pg_admin_dsn"], "dbos")
    dbos_app.configure(url)
    DBOS.launch()
    ids: dict[str, str] = {}

    async def start(key: str, steps: int, waits: int) -> str:
        handle = await DBOS.start_workflow_async(dbos_app.history, key, steps, waits)
        ids[key] = handle.workflow_id
        return key

    async def send(key: str, j: int) -> None:
        await DBOS.send_async(ids[key], "go", topic=f"{key}-{j}")

    try:
        return await scale.history(start, send, lambda: probe.MARKS, params["history"])
    finally:
        DBOS.destroy(workflow_completion_timeout_sec=1)


async def run(scenario: str, params: dict[str, Any]) -> dict[str, Any]:
    if scenario == "history":
        metrics = await _history(params)
        note = "started in process; the message is DBOS.send to the workflow's recv"
    elif scenario == "workers":
        metrics = await _workers(params)
        counts = ", ".join(map(str, params["workers_scale"]["counts"]))
        note = (
            f"{counts} DBOS processes (a fresh system database each) serve a queue polled "
            "every 10 ms"
        )
    elif scenario == "memory":
        metrics = await _memory(params)
        note = (
            "RSS of one DBOS process serving the queue: runs asleep for an hour, then (a "
            "fresh process) one-step runs"
        )
    elif scenario == "sleepers":
        metrics = await _sleepers(params)
        note = f"{params['workers']} DBOS processes serve the queue; sleeps are DBOS.sleep"
    else:
        raise Unsupported(f"no scenario {scenario!r}")
    os.environ.pop(probe.PROBE_FILE_ENV, None)
    return {"metrics": metrics, "notes": [note]}
