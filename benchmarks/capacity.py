"""The ceilings under one cluster's capacity, each measured alone (docs/scaling.md):
``python -m benchmarks.capacity [--quick] [--pg-fast]``.

On the harness's PostgreSQL (durable unless ``--pg-fast``) and nats-server, it times:

- ``commit``: one-row ``INSERT`` commits on 1 connection and on 16 (WAL fsync; the
  16 share fsyncs through group commit);
- ``notify``: the same with a ``pg_notify`` in each transaction (what every treadle
  append does), on 1 and 16 connections;
- ``append``: treadle's own append (``events.create``, one statement: lock the run's
  counter row, insert, move the counters, NOTIFY) sequentially on one run, from 16
  tasks on one run (all queue on its counter row), and from 16 tasks on 16 runs;
- ``publish``: JetStream publishes to a file stream of one replica, each awaited, and
  256 in flight;
- ``python``: a pure-Python JSON encode/decode loop of a step's event, as a yardstick
  of this machine's CPU for the per-run CPU the workers scenario reports.

No pg_stat_statements: every figure is a client-side rate over a fixed count. The
machine's load average is printed first and last: on a shared machine the figures
are indicative only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks import servers


async def _rate(count: int, width: int, one: Callable[[int, int], Awaitable[Any]]) -> float:
    """Calls per second of ``one(task, i)``: ``count`` calls spread over ``width`` tasks."""
    per = count // width

    async def task(t: int) -> None:
        for i in range(per):
            await one(t, i)

    started = time.perf_counter()
    await asyncio.gather(*(task(t) for t in range(width)))
    return per * width / (time.perf_counter() - started)


async def _commits(dsn: str, count: int) -> dict[str, float]:
    import asyncpg

    conns = [await asyncpg.connect(dsn) for _ in range(16)]
    try:
        await conns[0].execute("CREATE TABLE IF NOT EXISTS cap (id bigint, at timestamptz)")
        plain = "INSERT INTO cap VALUES ($1, now())"
        notify = "WITH i AS (INSERT INTO cap VALUES ($1, now())) SELECT pg_notify('cap', $1::text)"
        out: dict[str, float] = {}
        for name, sql in (("commit", plain), ("notify", notify)):
            for width in (1, 16):

                async def one(t: int, i: int, sql: str = sql) -> None:
                    await conns[t].execute(sql, i)

                out[f"{name}_per_s@{width}conn"] = await _rate(count, width, one)
        return out
    finally:
        for conn in conns:
            await conn.close()


async def _appends(dsn: str, count: int) -> dict[str, float]:
    from treadle.world import events
    from treadle.worlds.postgres import PostgresStorage
    from treadle.worlds.postgres.migrate import migrate

    await migrate(dsn)
    storage = await PostgresStorage.connect(dsn, pool_size=16)
    try:

        async def new_run() -> str:
            run = await storage.runs.create(
                workflow_name="cap", input=None, deployment_id="cap", spec_version=9
            )
            return run.run_id

        async def append(run_id: str, i: int) -> None:
            await storage.events.create(
                run_id, events.AttrSet(key=f"k{i % 10}", value=i), in_band=False
            )

        one = await new_run()
        runs = [await new_run() for _ in range(16)]
        sequential = await _rate(count, 1, lambda _t, i: append(one, i))
        shared = await _rate(count, 16, lambda _t, i: append(one, i))
        spread = await _rate(count, 16, lambda t, i: append(runs[t], i))
        return {
            "append_per_s@1run_1task": sequential,
            "append_per_s@1run_16tasks": shared,
            "append_per_s@16runs_16tasks": spread,
        }
    finally:
        await storage.close()


async def _publishes(url: str, count: int) -> dict[str, float]:
    from nats.aio.client import Client

    nc = Client()
    await nc.connect(url)
    js = nc.jetstream()
    stream = f"CAP{uuid.uuid4().hex[:6].upper()}"
    await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"], storage="file")
    try:
        subject = f"{stream.lower()}.x"
        payload = b'{"type":"step","run_id":"wrun_0123456789","step":"noop"}'
        awaited = await _rate(count, 1, lambda _t, _i: js.publish(subject, payload))
        started = time.perf_counter()
        for first in range(0, count, 256):
            await asyncio.gather(*(js.publish(subject, payload)
                                   for _ in range(min(256, count - first))))  # fmt: skip
        pipelined = count / (time.perf_counter() - started)
        return {"publish_per_s@awaited": awaited, "publish_per_s@256_in_flight": pipelined}
    finally:
        await js.delete_stream(stream)
        await nc.close()


def _python(count: int) -> dict[str, float]:
    event = {"type": "step_completed", "correlation_id": "s1", "result": {"n": 1, "ok": True},
             "run_id": "wrun_0123456789abcdef", "slot": 12}  # fmt: skip
    started = time.perf_counter()
    for _ in range(count):
        json.loads(json.dumps(event))
    return {"json_roundtrips_per_s@1core": count / (time.perf_counter() - started)}


async def measure(up: servers.Servers, count: int) -> dict[str, float]:
    dsn = await servers.fresh_database(up.pg_admin_dsn, "cap")
    out = await _commits(dsn, count)
    out |= await _appends(dsn, count)
    out |= await _publishes(up.nats_url, count)
    out |= _python(count * 20)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.capacity", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="200 calls a figure, not 4,000")
    parser.add_argument("--pg-fast", action="store_true", help="fsync off")
    args = parser.parse_args(argv)
    count = 192 if args.quick else 4000
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average {load}; PostgreSQL {'fast' if args.pg_fast else 'durable'}", flush=True)
    with servers.started(durable=not args.pg_fast) as up:
        figures = asyncio.run(measure(up, count))
    for name, value in figures.items():
        print(f"{name:32} {value:12,.0f}")
    print(f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
