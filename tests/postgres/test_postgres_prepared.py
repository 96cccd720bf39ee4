"""Prepared statements on the Postgres World's connections (``database``): the hot
statements are prepared once per connection and kept; 0 turns them off (a pooler)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from treadle import errors
from treadle.world import events
from treadle.worlds.postgres import PostgresStorage
from treadle.worlds.postgres.database import Database

_PREPARED = "SELECT statement FROM pg_prepared_statements WHERE statement LIKE '%treadle_%'"


async def _writes_and_reads(storage: PostgresStorage) -> str:
    run = await storage.runs.create(
        workflow_name="wf", input=None, deployment_id="d", spec_version=9
    )
    for i in range(5):
        await storage.events.create(
            run.run_id,
            events.StepCreated(correlation_id=f"s{i}", step_name="f"),
            in_band=False,
        )
        await storage.events.list(run.run_id)
    return run.run_id


@pytest.mark.parametrize("cache", [100, 0])
async def test_statements_are_prepared_once_per_connection_or_never(
    pg_dsn: str, cache: int
) -> None:
    storage = await PostgresStorage.connect(pg_dsn, pool_size=1, statement_cache_size=cache)
    try:
        run_id = await _writes_and_reads(storage)
        prepared = [r[0] for r in await storage._db.fetch(_PREPARED)]
        appends = [s for s in prepared if "treadle_append(" in s]
        if cache:
            assert len(appends) == 1, prepared  # five appends, one prepared statement
            assert len([s for s in prepared if "FROM treadle_runs r" in s]) == 1
        else:
            assert appends == [], prepared
        assert (await storage.events.list(run_id)).snapshot.seq == 6
    finally:
        await storage.close()


async def test_a_negative_cache_size_is_refused(pg_dsn: str) -> None:
    with pytest.raises(errors.WorldContractError, match="statement_cache_size"):
        await Database.connect(pg_dsn, statement_cache_size=-1)


async def test_fetch_first_goes_ahead_of_the_calls_waiting_for_a_connection(
    pg_dsn: str,
) -> None:
    """A pool of one held by a call blocked on an advisory lock: of two calls waiting for
    it, the ``fetch_first`` one (the write combiner's) runs first."""
    db = await Database.connect(pg_dsn, pool_size=1)
    admin = await asyncpg.connect(pg_dsn)
    order: list[str] = []

    async def call(name: str, first: bool) -> None:
        await (db.fetch_first if first else db.fetch)("SELECT $1::text", name)
        order.append(name)

    try:
        await admin.execute("SELECT pg_advisory_lock(7)")
        held = asyncio.ensure_future(db.fetch("SELECT pg_advisory_lock(7)"))
        waiting = [asyncio.ensure_future(call("read", False))]
        waiting.append(asyncio.ensure_future(call("write", True)))
        for _ in range(400):
            if len(db._waiters) == 2:
                break
            await asyncio.sleep(0.01)
        assert len(db._waiters) == 2
        await admin.execute("SELECT pg_advisory_unlock(7)")
        await asyncio.wait_for(asyncio.gather(held, *waiting), 10)
        assert order == ["write", "read"]
    finally:
        await admin.close()
        await db.close()
