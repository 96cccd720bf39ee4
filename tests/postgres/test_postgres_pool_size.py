"""``TREADLE_DATABASE_POOL_SIZE`` (issue 15 item 6; docs/scaling.md): the most storage
connections one process opens to PostgreSQL, for the World ``open_world("postgres")``
opens; the default is ``database.DEFAULT_POOL_SIZE`` (10)."""

from __future__ import annotations

import asyncio

import pytest

from treadle import errors, settings
from treadle.worlds import open_world
from treadle.worlds.postgres import database

from ..nats.conftest import NatsServer, nats_server

__all__ = ["nats_server"]


async def _backends_under_load(pool_size: str | None, dsn: str, nats_url: str, calls: int) -> int:
    """Distinct server backends serving ``calls`` concurrent storage calls."""
    env = {"TREADLE_DATABASE_URL": dsn, "TREADLE_NATS_URL": nats_url,
           "TREADLE_DEPLOYMENT_ID": "pool-size"}  # fmt: skip
    if pool_size is not None:
        env["TREADLE_DATABASE_POOL_SIZE"] = pool_size
    world = await open_world("postgres", settings=settings.load(env))
    try:
        db = world.storage._db  # type: ignore[attr-defined]
        rows = await asyncio.gather(
            *(db.fetchrow("SELECT pg_backend_pid() AS pid, pg_sleep(0.2)") for _ in range(calls))
        )
        return len({row["pid"] for row in rows})
    finally:
        await world.close()


async def test_the_pool_size_setting_bounds_the_connections(
    pg_dsn: str, nats_server: NatsServer
) -> None:
    """Six concurrent calls share two connections at TREADLE_DATABASE_POOL_SIZE=2."""
    assert await _backends_under_load("2", pg_dsn, nats_server.url, 6) == 2


async def test_without_the_setting_the_pool_holds_the_default(
    pg_dsn: str, nats_server: NatsServer
) -> None:
    calls = database.DEFAULT_POOL_SIZE + 4
    assert await _backends_under_load(None, pg_dsn, nats_server.url, calls) == (
        database.DEFAULT_POOL_SIZE
    )


def test_a_pool_size_below_one_is_refused() -> None:
    assert settings.load({}).TREADLE_DATABASE_POOL_SIZE == database.DEFAULT_POOL_SIZE
    with pytest.raises(errors.SettingsError, match="TREADLE_DATABASE_POOL_SIZE='0'"):
        settings.load({"TREADLE_DATABASE_POOL_SIZE": "0"})
