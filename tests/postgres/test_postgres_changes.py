"""The Postgres changes feed beyond the conformance suite: other processes, a lost listener.

Every committed event NOTIFYs ``run_id:slot``; the feed parses it (nowhere
else does) and reports ``RunChanged``. A listener connection terminated by the
server is reopened by itself while someone watches, and the watcher hears
``on_resync`` once it is back (issue 11 item 8; architecture review item 1: the
operator used to re-implement this).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from treadle.world import events
from treadle.world.conformance.changes import Heard
from treadle.worlds.postgres import PostgresStorage, feed


@pytest.fixture
async def storage(pg_dsn: str) -> AsyncIterator[PostgresStorage]:
    opened = await PostgresStorage.connect(pg_dsn, pool_size=2)
    try:
        yield opened
    finally:
        await opened.close()


async def _run(storage: PostgresStorage) -> str:
    run = await storage.runs.create(
        workflow_name="wf", input=None, deployment_id="d", spec_version=9
    )
    return run.run_id


async def test_another_processs_runs_and_events_are_reported(
    storage: PostgresStorage, pg_dsn: str
) -> None:
    heard = Heard()
    watch = await storage.changes.watch(heard.on_change, heard.on_resync)
    try:
        async with await PostgresStorage.connect(pg_dsn, pool_size=2) as other:
            run_id = await _run(other)
            for i in range(3):
                await other.events.create(
                    run_id, events.AttrSet(key=f"k{i}", value=i), in_band=False
                )
        await heard.until(lambda: heard.head.get(run_id, 0) == 4, f"run {run_id} up to slot 4")
        assert next(c.slot for c in heard.changes if c.run_id == run_id) == 1
        assert heard.resyncs == 0
    finally:
        watch.close()


async def test_a_creation_report_names_the_deployment_without_a_read(
    storage: PostgresStorage, pg_dsn: str
) -> None:
    """Migration 0007: each new run row NOTIFYs treadle_runs with its deployment, so a
    watcher that mirrors only some deployments never reads a run (review R5 (d))."""
    heard = Heard()
    watch = await storage.changes.watch(heard.on_change, heard.on_resync)
    try:
        async with await PostgresStorage.connect(pg_dsn, pool_size=2) as other:
            run = await other.runs.create(
                workflow_name="wf", input=None, deployment_id="dpl_blue", spec_version=9
            )
        await heard.until(lambda: run.run_id in heard.head, "the creation")
        created = [c for c in heard.changes if c.run_id == run.run_id]
        assert [(c.slot, c.deployment_id) for c in created] == [(1, "dpl_blue")]  # once
    finally:
        watch.close()


async def test_a_terminated_listener_reconnects_and_the_watcher_resyncs(
    storage: PostgresStorage, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(feed, "RECONNECT_SECONDS", 0.1)
    heard = Heard()
    watch = await storage.changes.watch(heard.on_change, heard.on_resync)
    try:
        pid = storage.feed.listener_pid
        assert pid is not None, "watch returns once the listener is open"
        admin = await asyncpg.connect(pg_dsn)
        try:
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        finally:
            await admin.close()
        await heard.until(lambda: heard.resyncs == 1, "a resync once the listener is back")
        assert storage.feed.listener_pid not in (None, pid)
        run_id = await _run(storage)
        await heard.until(lambda: run_id in heard.head, "a run created after the reconnect")
        await asyncio.sleep(0)  # nothing else pending: exactly one resync
        assert heard.resyncs == 1
    finally:
        watch.close()
