"""treadle's side of every scenario, on the local World or on Postgres + NATS.

TTFS, STSO and fan-out run with an in-process worker (``Workflows`` on the
local World; ``app.serve()`` on Postgres + NATS, so every step goes through
NATS). Throughput runs on the local World in-process (it serves one process)
and on Postgres + NATS with ``workers`` ``treadle worker`` processes beside the
starting process. Recovery kills a ``treadle worker`` process with SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks import measure, probe, servers
from benchmarks.processes import Worker, python
from benchmarks.systems import Unsupported
from benchmarks.systems.treadle_app import app, chain, crash_chain, fanout
from treadle import Workflows
from treadle.sdk import functions

APP_MODULE = "benchmarks.systems.treadle_app"
READY = "treadle worker: serving"
RESULT_TIMEOUT = 600.0


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


async def _serve_in_process(params: dict[str, Any]) -> None:
    os.environ.update(await world_env(params, "inproc"))
    if params["world"] == "local":
        await app.world()  # the local World starts its in-process worker
    else:
        await app.serve()


async def _ttfs(params: dict[str, Any]) -> dict[str, list[float]]:
    samples: list[float] = []
    for i in range(params["warmup"] + params["samples"]):
        key = f"ttfs{i}"
        run = await app.start(chain, key, 1)
        started = time.perf_counter_ns()
        await run.result(timeout=RESULT_TIMEOUT)
        if i >= params["warmup"]:
            samples.append(measure.first_start_ms(probe.MARKS[key], started))
    return {"ttfs_ms": samples}


async def _stso(params: dict[str, Any]) -> dict[str, list[float]]:
    await (await app.start(chain, "warm", 5)).result(timeout=RESULT_TIMEOUT)
    out: dict[str, list[float]] = {}
    for n in params["sizes"]:
        key = f"stso{n}"
        await (await app.start(chain, key, n)).result(timeout=RESULT_TIMEOUT)
        out[f"ms_per_step@{n}"] = [measure.ms_per_step(probe.MARKS[key])]
        if n == params["gap_size"]:
            out["stso_gap_ms"] = measure.step_gaps_ms(probe.MARKS[key])
    return out


async def _fanout(params: dict[str, Any]) -> dict[str, list[float]]:
    await (await app.start(fanout, "warm", 5)).result(timeout=RESULT_TIMEOUT)
    out: dict[str, list[float]] = {}
    for n in params["widths"]:
        key = f"fan{n}"
        run = await app.start(fanout, key, n)
        started = time.perf_counter_ns()
        await run.result(timeout=RESULT_TIMEOUT)
        for name, value in measure.fanout_ms(probe.MARKS[key], started).items():
            out[f"fanout{n}_{name}_ms"] = [value]
    return out


async def _burst(
    start: Any, read: Any, steps: int, count: int, concurrency: int
) -> tuple[float, float]:
    """Start ``count`` runs of ``steps`` steps at once; runs/s and steps/s until the last ends."""
    keys = [f"tp{steps}-{i}-{uuid.uuid4().hex[:6]}" for i in range(count)]
    queue = list(keys)
    first = time.perf_counter_ns()

    async def starter() -> None:
        while queue:
            await start(queue.pop(), steps)

    await asyncio.gather(*(starter() for _ in range(concurrency)))
    marks: dict[str, list[tuple[str, int]]] = {}

    def all_ended() -> bool:
        marks.update(read())
        return all(probe.time_of(marks.get(k, []), probe.END) is not None for k in keys)

    await measure.until(all_ended, RESULT_TIMEOUT, f"{count} runs of {steps} steps")
    last = max(probe.time_of(marks[k], probe.END) or 0 for k in keys)
    runs = measure.per_second(count, first, last)
    return runs, runs * steps


async def _throughput(params: dict[str, Any]) -> dict[str, list[float]]:
    spec = params["throughput"]
    out: dict[str, list[float]] = {}
    if params["world"] == "local":
        await _serve_in_process(params)

        async def start(key: str, steps: int) -> None:
            await app.start(chain, key, steps)

        def read() -> dict[str, list[tuple[str, int]]]:
            return probe.MARKS

        for steps, count in ((1, spec["one"]), (10, spec["ten"])):
            runs, per_step = await _burst(start, read, steps, count, spec["starters"])
            out[f"runs_per_s@{steps}step"] = [runs]
            out[f"steps_per_s@{steps}step"] = [per_step]
        return out
    workdir = Path(params["workdir"])
    probe_file = workdir / "throughput.marks"
    env = {**await world_env(params, "tp"), probe.PROBE_FILE_ENV: str(probe_file)}
    os.environ.update(env)
    workers = [
        await Worker.start(
            python("-m", "treadle.cli", "worker", APP_MODULE, "--grace", "2"),
            env,
            workdir / f"worker{i}.log",
            READY,
        )
        for i in range(params["workers"])
    ]
    client = Workflows(worker=False)
    try:

        async def start_remote(key: str, steps: int) -> None:
            data = functions.encode_arguments((key, steps), {}, "workflow chain")
            await client.start_encoded("chain", data)

        def read_file() -> dict[str, list[tuple[str, int]]]:
            return probe.read_file(probe_file)

        for steps, count in ((1, spec["one"]), (10, spec["ten"])):
            runs, per_step = await _burst(start_remote, read_file, steps, count, spec["starters"])
            out[f"runs_per_s@{steps}step"] = [runs]
            out[f"steps_per_s@{steps}step"] = [per_step]
    finally:
        await client.close()
        for worker in workers:
            await worker.stop()
    return out


async def _recovery(params: dict[str, Any]) -> dict[str, list[float]]:
    spec = params["recovery"]
    workdir = Path(params["workdir"])
    probe_file = workdir / "recovery.marks"
    env = {
        **await world_env(params, "rec"),
        probe.PROBE_FILE_ENV: str(probe_file),
        "TREADLE_QUEUE_LEASE_SECONDS": str(spec["lease_seconds"]),
    }
    os.environ.update(env)
    size = 1 if params["world"] == "local" else params["workers"]
    samples: list[float] = []
    client = Workflows(worker=False)
    serial = 0

    async def start_worker() -> Worker:
        nonlocal serial
        serial += 1
        argv = python("-m", "treadle.cli", "worker", APP_MODULE, "--grace", "1")
        return await Worker.start(argv, env, workdir / f"rec-worker{serial}.log", READY)

    def labels(key: str) -> list[str]:
        return [label for label, _ in probe.read_file(probe_file).get(key, [])]

    try:
        for i in range(spec["kills"]):
            key = f"rec{i}"
            workers = [await start_worker() for _ in range(size)]
            data = functions.encode_arguments((key, 4, 2), {}, "workflow crash_chain")
            await client.start_encoded(crash_chain.name, data)
            await measure.until(
                lambda k=key: any(x.startswith("2.1.") for x in labels(k)), 60, "the hang"
            )
            pid = int(next(x for x in labels(key) if x.startswith("2.1.")).split(".")[2])
            victim = next(w for w in workers if w.pid == pid)
            killed = await victim.kill()
            workers.remove(victim)
            if not workers:  # the local World: one worker at a time, restarted
                workers.append(await start_worker())
            timeout = spec["lease_seconds"] * 4 + 30
            await measure.until(
                lambda k=key: any(x.startswith("2.2.") for x in labels(k)), timeout, "recovery"
            )
            marks = probe.read_file(probe_file)[key]
            restarted = min(ns for label, ns in marks if label.startswith("2.2."))
            samples.append(measure.ms(restarted - killed))
            await measure.until(lambda k=key: probe.END in labels(k), 60, "the recovered run's end")
            for worker in workers:
                await worker.stop()
    finally:
        await client.close()
    return {"recovery_ms": samples}


async def run(scenario: str, params: dict[str, Any]) -> dict[str, Any]:
    notes: list[str] = []
    if scenario in ("ttfs", "stso", "fanout"):
        await _serve_in_process(params)
        where = "local World" if params["world"] == "local" else "NATS queue"
        notes.append(f"in-process worker through the {where}")
        try:
            metrics = await {"ttfs": _ttfs, "stso": _stso, "fanout": _fanout}[scenario](params)
        finally:
            await app.close(grace_seconds=2)
    elif scenario == "throughput":
        try:
            metrics = await _throughput(params)
        finally:
            await app.close(grace_seconds=2)
        notes.append(
            "in-process worker (the local World serves one process)"
            if params["world"] == "local"
            else f"{params['workers']} treadle worker processes and the starting process"
        )
    elif scenario == "recovery":
        metrics = await _recovery(params)
        if params["world"] == "local":
            notes.append("kill -9 of the one treadle worker, restarted at once (its start counts)")
        else:
            notes.append(
                f"kill -9 of one of {params['workers']} treadle workers; a survivor takes the "
                f"run once its lease lapses (TREADLE_QUEUE_LEASE_SECONDS="
                f"{params['recovery']['lease_seconds']:g}, default 30)"
            )
    else:
        raise Unsupported(f"no scenario {scenario!r}")
    return {"metrics": metrics, "notes": notes}
