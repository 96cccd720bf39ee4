"""treadle's side of every scenario, on the local World or on Postgres + NATS.

TTFS, STSO and fan-out run with an in-process worker (``Workflows`` on the
local World; ``app.serve()`` on Postgres + NATS, so every step goes through
NATS). Throughput runs on the local World in-process (it serves one process)
and on Postgres + NATS with ``workers`` ``treadle worker`` processes beside the
starting process. Recovery kills a ``treadle worker`` process with SIGKILL.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from benchmarks import probe, scale, scenarios, servers
from benchmarks.processes import Worker, python
from benchmarks.systems import Unsupported
from benchmarks.systems.treadle_app import app
from treadle import Run, Workflows
from treadle.sdk import functions

APP_MODULE = "benchmarks.systems.treadle_app"
# TREADLE_QUEUE_LEASE_SECONDS's default: recovery runs with it (nothing set).
LEASE_SECONDS = 30.0
READY = "treadle worker: serving"


class Driver:
    """Starts runs by name on ``client`` (the app itself, or a worker-less client)."""

    def __init__(self, client: Workflows) -> None:
        self.client = client

    async def start(self, workflow: str, *args: Any) -> Run:
        data = functions.encode_arguments(args, {}, f"workflow {workflow}")
        return await self.client.start_encoded(workflow, data)

    async def wait(self, handle: Run) -> None:
        await handle.result(timeout=scenarios.RESULT_TIMEOUT)


async def world_env(params: dict[str, Any], tag: str) -> dict[str, str]:
    """The environment that points treadle at a World of this child's own."""
    if params["world"] == "local":
        return {"TREADLE_WORLD": f"local:{Path(params['workdir']) / f'world-{tag}'}"}
    from treadle.worlds.postgres.migrate import migrate

    dsn = await servers.fresh_database(params["pg_admin_dsn"], "treadle")
    await migrate(dsn)
    return {
        "TREADLE_WORLD": "postgres",
        "TREADLE_DATABASE_URL": dsn,
        "TREADLE_NATS_URL": params["nats_url"],
        # A deployment of its own: its own NATS consumers, nothing left by another child.
        "TREADLE_DEPLOYMENT_ID": f"bench-{uuid.uuid4().hex[:10]}",
    }


async def _in_process(scenario: str, params: dict[str, Any]) -> scenarios.Metrics:
    os.environ.update(await world_env(params, "inproc"))
    if params["world"] == "local":
        await app.world()  # the local World starts its in-process worker
    else:
        await app.serve()
    driver = Driver(app)
    try:
        if scenario == "ttfs":
            return await scenarios.ttfs(driver, params)
        if scenario == "stso":
            return await scenarios.stso(driver, params)
        if scenario == "fanout":
            return await scenarios.fanout(driver, params)
        return await scenarios.throughput(_start_chain(driver), lambda: probe.MARKS,
                                          params["throughput"])  # fmt: skip
    finally:
        await app.close(grace_seconds=2)


def _start_chain(driver: Driver) -> Any:
    async def start(key: str, steps: int) -> None:
        await driver.start("chain", key, steps)

    return start


class Workers:
    """``treadle worker`` processes on this child's World, marks to ``probe_file``; each
    started with an identity (``TREADLE_WORKER_ID``) when ``named``."""

    def __init__(self, env: dict[str, str], workdir: Path, *, named: bool = False) -> None:
        self.env = env
        self.workdir = workdir
        self.serial = 0
        self.named = named
        self.ids: dict[int, str] = {}

    async def start(self, worker_id: str | None = None) -> Worker:
        self.serial += 1
        env = dict(self.env)
        if worker_id is None and self.named:
            worker_id = f"bench-worker-{self.serial}"
        if worker_id is not None:
            env["TREADLE_WORKER_ID"] = worker_id
        argv = python("-m", "treadle.cli", "worker", APP_MODULE, "--grace", "1")
        worker = await Worker.start(argv, env, self.workdir / f"worker{self.serial}.log", READY)
        if worker_id is not None:
            self.ids[worker.pid] = worker_id
        return worker

    async def start_many(self, count: int) -> list[Worker]:
        return [await self.start() for _ in range(count)]

    async def restart_in_place(self, victim: Worker) -> Worker:
        """A new process under the dead one's identity (a container restarted in its pod)."""
        return await self.start(self.ids[victim.pid])


async def _throughput_on_workers(params: dict[str, Any]) -> scenarios.Metrics:
    workdir = Path(params["workdir"])
    probe_file = workdir / "throughput.marks"
    env = {**await world_env(params, "tp"), probe.PROBE_FILE_ENV: str(probe_file)}
    os.environ.update(env)
    workers = await Workers(env, workdir).start_many(params["workers"])
    client = Workflows(worker=False)
    try:
        return await scenarios.throughput(
            _start_chain(Driver(client)), lambda: probe.read_file(probe_file),
            params["throughput"],
        )  # fmt: skip
    finally:
        await client.close()
        for worker in workers:
            await worker.stop()


async def _recovery(params: dict[str, Any]) -> scenarios.Metrics:
    """kill -9 inside a step, with the default lease (30 s) and liveness (3 s):

    - ``recovery_ms``, restart in place: a new process under the dead worker's
      ``TREADLE_WORKER_ID`` (the local World: the next process to open it), started
      right after the kill, so its start-up counts;
    - ``recovery_takeover_ms`` (Postgres + NATS): no new process; the surviving worker
      takes the step over once the dead one's heartbeat is older than its liveness.
    """
    spec = params["recovery"]
    workdir = Path(params["workdir"])
    probe_file = workdir / "recovery.marks"
    env = {**await world_env(params, "rec"), probe.PROBE_FILE_ENV: str(probe_file)}
    os.environ.update(env)
    local = params["world"] == "local"
    workers = Workers(env, workdir, named=True)
    client = Workflows(worker=False)
    driver = Driver(client)

    async def start_run(key: str) -> None:
        await driver.start("crash_chain", key, scenarios.CRASH_STEPS, scenarios.HANG_AT)

    count = 1 if local else params["workers"]
    try:
        metrics = await scenarios.recovery(
            kills=spec["kills"],
            probe_file=probe_file,
            start_workers=lambda: workers.start_many(count),
            replace=None,
            replace_victim=workers.restart_in_place,
            start_run=start_run,
            timeout=LEASE_SECONDS * 2 + 30,
        )
        if not local:
            metrics |= await scenarios.recovery(
                kills=spec["kills"],
                probe_file=probe_file,
                start_workers=lambda: workers.start_many(count),
                replace=None,
                start_run=start_run,
                timeout=LEASE_SECONDS * 2 + 30,
                metric="recovery_takeover_ms",
            )
        return metrics
    finally:
        await client.close()


async def run(scenario: str, params: dict[str, Any]) -> dict[str, Any]:
    if scenario in scale.SCENARIOS:  # issue 15 item 5: benchmarks.systems.treadle_scale
        from benchmarks.systems import treadle_scale

        return await treadle_scale.run(scenario, params)
    local = params["world"] == "local"
    notes: list[str] = []
    if scenario in ("ttfs", "stso", "fanout") or (scenario == "throughput" and local):
        metrics = await _in_process(scenario, params)
        if scenario == "throughput":
            notes.append("in-process worker (the local World serves one process)")
        else:
            queue = "local World" if local else "NATS"
            notes.append(f"in-process worker through the {queue} queue")
    elif scenario == "throughput":
        metrics = await _throughput_on_workers(params)
        notes.append(f"{params['workers']} treadle worker processes and the starting process")
    elif scenario == "recovery":
        metrics = await _recovery(params)
        if local:
            notes.append(
                "kill -9 of the one treadle worker; another starts at once (its start-up "
                "counts) and releases every lease at open; no survivor (one process serves "
                "a local World)"
            )
        else:
            notes.append(
                f"kill -9 of one of {params['workers']} treadle workers, default lease (30 s) "
                "and liveness (3 s): recovery_ms restarts it in place (same TREADLE_WORKER_ID, "
                "start-up counts); recovery_takeover_ms leaves it dead for the survivor"
            )
    else:
        raise Unsupported(f"no scenario {scenario!r}")
    return {"metrics": metrics, "notes": notes}
