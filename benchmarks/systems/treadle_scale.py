"""treadle's side of the scale scenarios (``benchmarks.scale``), on Postgres + NATS.

``workers``, ``memory`` and ``sleepers`` run ``treadle worker`` processes (a fresh
database and deployment for each fleet) and start runs from a worker-less client in
this process; ``history`` runs with an in-process worker on either World, with
``WORKFLOW_ORCHESTRATOR_LINGER_MS=0``, so each hook resume is a new delivery, not a
wake-up of a delivery still holding the log: it continues the run's warm session (it
reads only the new events, docs/warm.md), or loads the whole log under
``TREADLE_WARM_RUNS=0``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from benchmarks import probe, scale, scenarios
from benchmarks.systems import Unsupported
from benchmarks.systems.treadle_app import app
from benchmarks.systems.treadle_bench import Driver, Workers, world_env
from treadle import Run, Workflows
from treadle.errors import HookNotFound

NEEDS_POSTGRES = (
    "runs on the production World (Postgres + NATS) with treadle worker processes; "
    "the local World serves one process"
)


@contextlib.asynccontextmanager
async def _fleet(
    params: dict[str, Any], count: int, tag: str
) -> AsyncIterator[tuple[Workers, list[Any], Driver, Path]]:
    workdir = Path(params["workdir"])
    probe_file = workdir / f"{tag}.marks"
    env = {**await world_env(params, tag), probe.PROBE_FILE_ENV: str(probe_file)}
    os.environ.update(env)
    workers = Workers(env, workdir)
    running = await workers.start_many(count)
    client = Workflows(worker=False)
    try:
        yield workers, running, Driver(client), probe_file
    finally:
        await client.close()
        for worker in running:
            await worker.stop()


def _chains(driver: Driver) -> scale.StartChain:
    async def start(key: str, steps: int) -> None:
        await driver.start("chain", key, steps)

    return start


def _sleepers(driver: Driver) -> scale.StartSleeper:
    async def start(key: str, due: float) -> None:
        await driver.start("sleeper", key, due)

    return start


async def _workers(params: dict[str, Any]) -> scenarios.Metrics:
    @contextlib.asynccontextmanager
    async def fleet(
        count: int,
    ) -> AsyncIterator[tuple[scale.StartChain, scale.Read, scale.Costs]]:
        async with _fleet(params, count, f"w{count}") as (_, running, driver, marks):

            async def costs() -> dict[str, float]:
                out = await scale.postgres_costs(os.environ["TREADLE_DATABASE_URL"])
                out["cpu_s"] = sum(scale.cpu_seconds(w.pid) for w in running)
                out["stream_msgs"] = await _stream_messages(params["nats_url"])
                return out

            yield _chains(driver), lambda: probe.read_file(marks), costs

    return await scale.workers(fleet, params["workers_scale"])


async def _stream_messages(url: str) -> float:
    """Messages ever stored in the queue's stream (its last sequence number)."""
    import json

    from nats.aio.client import Client

    from treadle.worlds.nats import names

    nc = Client()
    await nc.connect(url)
    try:
        reply = await nc.request(f"$JS.API.STREAM.INFO.{names.DEFAULT_STREAM}", b"", timeout=5)
    finally:
        await nc.close()
    return float(json.loads(reply.data)["state"]["last_seq"])


async def _memory(params: dict[str, Any]) -> scenarios.Metrics:
    spec = params["memory"]
    async with _fleet(params, 1, "msleep") as (_, (worker,), driver, marks):
        out = await scale.memory_sleeping(
            _sleepers(driver), lambda: probe.read_file(marks), worker.pid, spec
        )
    async with _fleet(params, 1, "mruns") as (_, (worker,), driver, marks):
        out |= await scale.memory_runs(
            _chains(driver), lambda: probe.read_file(marks), worker.pid, spec
        )
    return out


async def _sleepers_scenario(params: dict[str, Any]) -> scenarios.Metrics:
    async with _fleet(params, params["workers"], "sleep") as (_, _running, driver, marks):
        return await scale.sleepers(
            _sleepers(driver), lambda: probe.read_file(marks), params["sleepers"]
        )


async def _history(params: dict[str, Any]) -> scenarios.Metrics:
    os.environ["WORKFLOW_ORCHESTRATOR_LINGER_MS"] = "0"
    os.environ.update(await world_env(params, "hist"))
    if params["world"] == "local":
        await app.world()
    else:
        await app.serve()
    driver = Driver(app)

    async def start(key: str, steps: int, waits: int) -> Run:
        return await driver.start("history", key, steps, waits)

    async def send(key: str, j: int) -> None:
        while True:
            try:
                await app.resume_hook(f"{key}-{j}", "go")
                return
            except HookNotFound:  # its pass is still deciding: look again shortly
                await asyncio.sleep(0.002)

    async def count_events(run: Run) -> int:
        await run.result(timeout=scenarios.RESULT_TIMEOUT)
        return len(await run.events())

    try:
        return await scale.history(
            start, send, lambda: probe.MARKS, params["history"], count_events
        )
    finally:
        await app.close(grace_seconds=2)


async def run(scenario: str, params: dict[str, Any]) -> dict[str, Any]:
    local = params["world"] == "local"
    if scenario == "history":
        metrics = await _history(params)
        queue = "local World" if local else "NATS"
        return {"metrics": metrics, "notes": [
            f"in-process worker through the {queue} queue; WORKFLOW_ORCHESTRATOR_LINGER_MS=0, "
            "so every hook resume is a new delivery; TREADLE_WARM_RUNS="
            f"{os.environ.get('TREADLE_WARM_RUNS', 'default')} (0: it loads the whole log)"
        ]}  # fmt: skip
    if local:
        raise Unsupported(NEEDS_POSTGRES)
    if scenario == "workers":
        counts = ", ".join(map(str, params["workers_scale"]["counts"]))
        note = f"{counts} treadle worker processes (a fresh database each) and the starting process"
        return {"metrics": await _workers(params), "notes": [note]}
    if scenario == "memory":
        return {"metrics": await _memory(params), "notes": [
            "RSS of one treadle worker process: holding runs asleep for an hour, then (a "
            "fresh worker) after one-step runs; growth from the first chunk to the last"
        ]}  # fmt: skip
    if scenario == "sleepers":
        spec = params["sleepers"]
        return {"metrics": await _sleepers_scenario(params), "notes": [
            f"{spec['count']} runs started at {spec['rate']}/s, each sleeping "
            f"{spec['delay_seconds']:g} s, on {params['workers']} treadle worker processes"
        ]}  # fmt: skip
    raise Unsupported(f"no scenario {scenario!r}")
