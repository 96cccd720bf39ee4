"""No statement on the Postgres World runs without a deadline (audit section 5
"Observations": there was no statement or read timeout anywhere; seed 003
``WORKFLOW_ORCHESTRATOR_READ_TIMEOUT_MS``: "no read ... would hold the run")."""

from __future__ import annotations

import time

import pytest

from treadle import errors, settings
from treadle.worlds import open_world
from treadle.worlds.postgres import database
from treadle.worlds.postgres.database import Database

from ..nats.conftest import NatsServer, nats_server

__all__ = ["nats_server"]


async def test_a_statement_running_past_the_statement_timeout_is_cancelled(pg_dsn: str) -> None:
    """The server cancels it (``statement_timeout``); the caller gets StorageUnavailable
    quickly, and the pool serves the next call."""
    db = await Database.connect(pg_dsn, statement_timeout_ms=300)
    try:
        began = time.monotonic()
        with pytest.raises(errors.StorageUnavailable, match="statement timeout"):
            await db.fetch("SELECT pg_sleep(30)")
        assert time.monotonic() - began < 10
        assert (await db.fetchrow("SELECT 1 AS one"))["one"] == 1  # type: ignore[index]
    finally:
        await db.close()


async def test_a_call_whose_answer_never_comes_gives_up_on_the_client_side(pg_dsn: str) -> None:
    """A connection that stops answering (here: the server-side deadline switched off for
    the session, so only the client's command timeout is left) fails the call after the
    statement timeout plus the grace; the connection is dropped, a new one serves next."""
    db = await Database.connect(pg_dsn, statement_timeout_ms=200)
    try:
        await db.fetch("SELECT set_config('statement_timeout', '0', false)")
        began = time.monotonic()
        with pytest.raises(errors.StorageUnavailable, match="unavailable"):
            await db.fetch("SELECT pg_sleep(30)")
        elapsed = time.monotonic() - began
        assert 0.2 + database.CLIENT_TIMEOUT_GRACE_SECONDS - 1 < elapsed < 20
        assert (await db.fetchrow("SELECT 1 AS one"))["one"] == 1  # type: ignore[index]
    finally:
        await db.close()


async def test_every_pooled_connection_carries_the_statement_timeout(pg_dsn: str) -> None:
    db = await Database.connect(pg_dsn)
    try:
        row = await db.fetchrow(
            "SELECT setting::int FROM pg_settings WHERE name = 'statement_timeout'"
        )
        assert row is not None and row[0] == database.STATEMENT_TIMEOUT_MS
    finally:
        await db.close()


async def test_the_statement_timeout_comes_from_its_setting(
    pg_dsn: str, nats_server: NatsServer
) -> None:
    """``TREADLE_DATABASE_STATEMENT_TIMEOUT_MS`` reaches every connection of the World
    ``open_world("postgres")`` opens."""
    config = settings.load(
        {
            "TREADLE_DATABASE_URL": pg_dsn,
            "TREADLE_NATS_URL": nats_server.url,
            "TREADLE_DATABASE_STATEMENT_TIMEOUT_MS": "250",
            "TREADLE_DEPLOYMENT_ID": "timeouts",
        }
    )
    world = await open_world("postgres", settings=config)
    try:
        db = world.storage._db  # type: ignore[attr-defined]
        row = await db.fetchrow(
            "SELECT setting::int FROM pg_settings WHERE name = 'statement_timeout'"
        )
        assert row is not None and row[0] == 250
        with pytest.raises(errors.StorageUnavailable, match="statement timeout"):
            await db.fetch("SELECT pg_sleep(30)")
    finally:
        await world.close()
