"""Round trips, transactions and notifications of the Postgres World (a script, not a test).

Usage: PYTHONPATH=<tree>/runtime python tests/postgres/bench_round_trips.py [--repeats N]

Starts a throwaway durable PostgreSQL (``pgserver``), migrates it and measures,
on whatever treadle ``PYTHONPATH`` names (run it on two trees for a before and an
after):

- a fan-out's completions: one run with W steps, W concurrent background-step
  writers each writing ``step_started`` then ``step_completed`` out of band (a
  pool of 10, as a worker has): wall time, write transactions (XIDs used) and
  NOTIFYs a LISTEN connection hears;
- a batch of 10 events: NOTIFYs heard;
- sequential single in-band appends on one connection, per statement cache size
  (when this treadle has the setting): appends/s;
- ``Run.result`` on a run of 500 events that ends 2.5 s after the wait begins:
  statements the wait sent and events it read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).parent))

import pgserver

from treadle import client, errors, settings
from treadle.world import events
from treadle.worlds.postgres import PostgresStorage
from treadle.worlds.postgres.migrate import migrate


class Heard:
    def __init__(self) -> None:
        self.payloads: list[str] = []
        self.news = asyncio.Event()

    def __call__(self, _c: object, _p: int, _ch: str, payload: str) -> None:
        self.payloads.append(payload)
        self.news.set()

    async def until(self, payload: str) -> int:
        while payload not in self.payloads:
            self.news.clear()
            await asyncio.wait_for(self.news.wait(), 30)
        return self.payloads.index(payload) + 1


async def _xid(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT txid_current()"))


async def _fanout(
    dsn: str, width: int, heard: Heard, admin: asyncpg.Connection, handler: bool, **options: Any
) -> dict[str, Any]:
    async with await PostgresStorage.connect(dsn, pool_size=10, **options) as storage:
        run = await storage.runs.create(
            workflow_name="bench", input=None, deployment_id="d", spec_version=9
        )
        created = [events.StepCreated(correlation_id=f"s{i}", step_name="f") for i in range(width)]
        for i in range(0, width, 64):  # constants.MAX_BATCH_EVENTS
            await storage.events.create_batch(run.run_id, created[i : i + 64], in_band=False)
        seq = (await storage.runs.get(run.run_id)).seq
        await heard.until(f"{run.run_id}:{seq}")
        mark = len(heard.payloads)

        slots = asyncio.Semaphore(32)  # a worker's step messages in flight

        async def step(i: int) -> None:
            async with slots:
                if handler:  # as the background step handler: read the log first
                    after = 0
                    while True:
                        page = await storage.events.list(run.run_id, after_slot=after)
                        if not page.has_more:
                            break
                        after = page.cursor
                await write(i)

        async def write(i: int) -> None:
            cid = f"s{i}"
            start = events.StepStarted(correlation_id=cid, step_name="f", attempt=1)
            await storage.events.create(run.run_id, start, in_band=False)
            done = events.StepCompleted(correlation_id=cid, step_name="f", result=i)
            await storage.events.create(run.run_id, done, in_band=False)

        before = await _xid(admin)
        started = time.perf_counter()
        await asyncio.gather(*(step(i) for i in range(width)))
        elapsed = time.perf_counter() - started
        xids = await _xid(admin) - before - 1
        top = (await storage.runs.get(run.run_id)).seq
        assert top == seq + 2 * width
        notifies = await heard.until(f"{run.run_id}:{top}") - mark
        return {"ms": elapsed * 1000, "transactions": xids, "notifies": notifies}


async def _batch_notifies(dsn: str, heard: Heard) -> int:
    async with await PostgresStorage.connect(dsn, pool_size=1) as storage:
        run = await storage.runs.create(
            workflow_name="bench", input=None, deployment_id="d", spec_version=9
        )
        await heard.until(f"{run.run_id}:1")
        mark = len(heard.payloads)
        batch = [events.StepCreated(correlation_id=f"s{i}", step_name="f") for i in range(10)]
        await storage.events.create_batch(run.run_id, batch, in_band=False)
        return await heard.until(f"{run.run_id}:11") - mark


async def _singles(dsn: str, count: int, **options: Any) -> float:
    async with await PostgresStorage.connect(dsn, pool_size=1, **options) as storage:
        run = await storage.runs.create(
            workflow_name="bench", input=None, deployment_id="d", spec_version=9
        )
        seq = 1
        for warm in (True, False):
            started = time.perf_counter()
            for i in range(count if not warm else 50):
                await storage.events.create(
                    run.run_id,
                    events.AttrSet(key=f"k{i % 10}", value=i),
                    in_band=True,
                    expected_seq_in_band=seq,
                    event_count=seq,
                )
                seq += 1
        return count / (time.perf_counter() - started)


class _App:
    """What ``Run.result`` needs of its app: the World (here its storage) and settings."""

    def __init__(self, world: Any) -> None:
        self._world = world
        self.settings = settings.load({})

    async def world(self) -> Any:
        return self._world

    def use_payload_keys(self) -> None:
        pass


async def _result_wait(dsn: str) -> tuple[int, int]:
    async with await PostgresStorage.connect(dsn, pool_size=2) as storage:
        run = await storage.runs.create(
            workflow_name="bench", input=None, deployment_id="d", spec_version=9
        )
        for i in range(0, 500, 64):
            batch = [
                events.StepCreated(correlation_id=f"s{j}", step_name="f")
                for j in range(i, min(i + 64, 500))
            ]
            await storage.events.create_batch(run.run_id, batch, in_band=False)
        db: Any = storage._db
        calls = [0, 0]
        fetch, fetchrow = db.fetch, db.fetchrow

        async def counted_fetch(sql: str, *args: object) -> Any:
            rows = await fetch(sql, *args)
            calls[0] += 1
            calls[1] += sum(1 for r in rows if "slot" in sql and len(r) > 2 and r[2] is not None)
            return rows

        async def counted_fetchrow(sql: str, *args: object) -> Any:
            calls[0] += 1
            return await fetchrow(sql, *args)

        db.fetch, db.fetchrow = counted_fetch, counted_fetchrow

        async def end_later() -> None:
            await asyncio.sleep(2.5)
            cancel = events.RunCancelled(reason="bench")
            await storage.events.create(run.run_id, cancel, in_band=False)

        ender = asyncio.ensure_future(end_later())
        with contextlib.suppress(errors.RunCancelledError):
            await client.Run(_App(storage), run.run_id).result(timeout=30)  # type: ignore[arg-type]
        await ender
        return calls[0] - 1, calls[1]  # less the cancel's own append


async def _measure(dsn: str, repeats: int, count: int) -> None:
    await migrate(dsn)
    admin = await asyncpg.connect(dsn)
    listener = await asyncpg.connect(dsn)
    heard = Heard()
    await listener.add_listener("treadle_events", heard)
    try:
        print(f"NOTIFYs for one batch of 10 events: {await _batch_notifies(dsn, heard)}")
        statements, read = await _result_wait(dsn)
        print(
            f"Run.result over a 2.5 s wait on a 500-event run: {statements} statements, "
            f"{read} events read"
        )
        groups = "group_writes" in inspect.signature(PostgresStorage.connect).parameters
        for width, handler, grouped in (
            (w, h, g) for h in (False, True) for w in (100, 1000) for g in (False, True)
        ):
            if grouped and not groups:
                continue
            options = {"group_writes": grouped} if groups else {}
            rows = [
                await _fanout(dsn, width, heard, admin, handler, **options) for _ in range(repeats)
            ]
            ms = [r["ms"] for r in rows]
            mode = f", group_writes={grouped}" if groups else ""
            print(
                f"fan-out {width}{', each reading the log first' if handler else ''}{mode}"
                f": {2 * width} out-of-band writes, 32 at a time, in "
                f"{statistics.median(ms):,.0f} ms median ({', '.join(f'{m:,.0f}' for m in ms)}); "
                f"write transactions {[r['transactions'] for r in rows]}, "
                f"NOTIFYs {[r['notifies'] for r in rows]}"
            )
        cached = "statement_cache_size" in inspect.signature(PostgresStorage.connect).parameters
        for size in (100, 0) if cached else (None,):
            options = {} if size is None else {"statement_cache_size": size}
            rates = [await _singles(dsn, count, **options) for _ in range(repeats)]
            label = "asyncpg default (100)" if size is None else str(size)
            each = ", ".join(f"{r:,.0f}" for r in rates)
            print(
                f"single in-band appends, one connection, statement cache {label}: "
                f"{statistics.median(rates):,.0f}/s median ({each})"
            )
    finally:
        await listener.close()
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--count", type=int, default=1000)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="treadle-pg-rt-"))
    server = pgserver.start(directory)
    try:
        print(f"PostgreSQL on 127.0.0.1:{server.port}, durable")
        asyncio.run(_measure(server.dsn(), args.repeats, args.count))
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
