"""Measure single in-band appends per second on one connection (a script, not a test).

Usage: python tests/postgres/bench_append.py [--count N] [--fast]

Starts a throwaway PostgreSQL (``pgserver``; durable settings unless --fast),
migrates it, and times N sequential in-band ``events.create`` calls on a pool of
one connection, then the same as batches of 10, then, for comparison, a
multi-statement transaction doing what the append function does in one
statement (lock the counter row, insert, move the counters).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).parent))

import pgserver

from treadle.world import events
from treadle.worlds.postgres import PostgresStorage
from treadle.worlds.postgres.migrate import migrate


async def _singles(storage: PostgresStorage, count: int) -> float:
    run = await storage.runs.create(
        workflow_name="bench", input=None, deployment_id="dpl", spec_version=9
    )
    seq = seq_in_band = 1
    started = time.perf_counter()
    for i in range(count):
        await storage.events.create(
            run.run_id,
            events.AttrSet(key=f"k{i % 10}", value=i),
            in_band=True,
            expected_seq_in_band=seq_in_band,
            event_count=seq,
        )
        seq += 1
        seq_in_band += 1
    return count / (time.perf_counter() - started)


async def _batches(storage: PostgresStorage, count: int, size: int) -> float:
    run = await storage.runs.create(
        workflow_name="bench", input=None, deployment_id="dpl", spec_version=9
    )
    seq = 1
    started = time.perf_counter()
    for i in range(count // size):
        batch: list[events.Event] = [
            events.StepCreated(correlation_id=f"s{i}_{j}", step_name="fetch", input={"n": j})
            for j in range(size)
        ]
        await storage.events.create_batch(
            run.run_id, batch, in_band=True, expected_seq_in_band=seq, event_count=seq
        )
        seq += size
    return (count // size) * size / (time.perf_counter() - started)


async def _multi_statement(dsn: str, count: int) -> float:
    """The baseline the one-statement append replaces: a transaction of four statements."""
    conn = await asyncpg.connect(dsn)
    await conn.execute(
        "INSERT INTO treadle_runs VALUES ('wrun_bench', 'b', 'd', 9, 'running', 'null', NULL, "
        "NULL, '{}', 1, 1, now(), now(), NULL, NULL)"
    )
    started = time.perf_counter()
    for _ in range(count):
        async with conn.transaction():
            row = await conn.fetchrow(
                "SELECT seq, seq_in_band FROM treadle_runs WHERE run_id = $1 FOR UPDATE",
                "wrun_bench",
            )
            slot = row[0] + 1
            await conn.execute(
                "INSERT INTO treadle_events (run_id, slot, type, in_band, created_at, data) "
                "VALUES ($1, $2, 'noop', true, now(), '{\"type\": \"noop\"}')",
                "wrun_bench",
                slot,
            )
            await conn.execute(
                "UPDATE treadle_runs SET seq = $2, seq_in_band = seq_in_band + 1 WHERE run_id = $1",
                "wrun_bench",
                slot,
            )
    rate = count / (time.perf_counter() - started)
    await conn.close()
    return rate


async def _measure(dsn: str, count: int) -> None:
    await migrate(dsn)
    async with await PostgresStorage.connect(dsn, pool_size=1) as storage:
        await _singles(storage, 50)  # warm up: prepared statements, plpgsql plans
        print(f"single in-band creates, one connection: {await _singles(storage, count):,.0f}/s")
        rate = await _batches(storage, count, 10)
        print(f"in-band batches of 10, one connection:  {rate:,.0f} events/s")
    print(f"multi-statement transaction baseline:   {await _multi_statement(dsn, count):,.0f}/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--fast", action="store_true", help="fsync off (as the tests run)")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="treadle-pg-bench-"))
    server = pgserver.start(directory, fast=args.fast)
    try:
        print(f"PostgreSQL on 127.0.0.1:{server.port}, {'fsync off' if args.fast else 'durable'}")
        asyncio.run(_measure(server.dsn(), args.count))
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
