"""Schema migrations: numbered plain-SQL files, applied in order, recorded in a table.

``migrations/NNNN_name.sql`` are applied by ``migrate(dsn)`` (``treadle
migrate``): each pending one in its own transaction, recorded in
``treadle_schema_version`` with its name and checksum, under a session advisory
lock so two processes never migrate at once (the second waits, then finds
nothing to do). ``check_schema`` is what a worker runs at start: it raises
``IncompatibleStorage`` naming what to do when the database is behind
(``treadle migrate``) or ahead (a newer treadle migrated it).

Called by the CLI and by ``PostgresStorage.connect``.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol

import asyncpg

from treadle import errors, redaction
from treadle.worlds.postgres.database import DRIVER_ERRORS, describe, map_error

# "trdl": the advisory lock a migration holds for its session.
MIGRATION_LOCK_KEY = 0x7472646C
VERSION_TABLE = "treadle_schema_version"
_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_CREATE_VERSION_TABLE = f"""
CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations() -> list[Migration]:
    """Every migration shipped with this treadle, in version order (reads files)."""
    folder = resources.files("treadle.worlds.postgres").joinpath("migrations")
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _FILE_NAME.match(entry.name)
        if match is not None:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise errors.IncompatibleStorage(
            f"treadle's Postgres migrations are not numbered 1..n: {versions}"
        )
    return found


def latest_version() -> int:
    """The schema version this treadle needs (lists the migration files)."""
    folder = resources.files("treadle.worlds.postgres").joinpath("migrations")
    numbers = [int(m[1]) for e in folder.iterdir() if (m := _FILE_NAME.match(e.name))]
    return max(numbers, default=0)


async def migrate(dsn: str) -> list[int]:
    """Apply every pending migration to the database at ``dsn``; return the versions applied.

    Each migration runs in its own transaction. Running it again applies nothing.
    """
    migrations = await asyncio.to_thread(load_migrations)
    if "://" in dsn:
        redaction.require_readable(dsn, "the Postgres DSN")
    where = describe(dsn)
    try:
        conn = await asyncpg.connect(dsn, server_settings={"application_name": "treadle-migrate"})
    except DRIVER_ERRORS as exc:
        raise map_error(exc, f"cannot connect to {where} to migrate it") from exc
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        try:
            return await _apply(conn, migrations, where)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    except DRIVER_ERRORS as exc:
        raise map_error(exc, f"migrating {where} failed") from exc
    finally:
        await conn.close()


async def _apply(conn: Any, migrations: list[Migration], where: str) -> list[int]:
    await conn.execute(_CREATE_VERSION_TABLE)
    applied = {int(r[0]) for r in await conn.fetch(f"SELECT version FROM {VERSION_TABLE}")}
    known = {m.version for m in migrations}
    if applied - known:
        raise _ahead(where, max(applied), max(known, default=0))
    done: list[int] = []
    for migration in migrations:
        if migration.version in applied:
            continue
        async with conn.transaction():
            await conn.execute(migration.sql)
            await conn.execute(
                f"INSERT INTO {VERSION_TABLE} (version, name, checksum) VALUES ($1, $2, $3)",
                migration.version,
                migration.name,
                migration.checksum,
            )
        done.append(migration.version)
    return done


class _Fetcher(Protocol):
    async def fetch(self, query: str, /, *args: object) -> Any: ...


def _ahead(where: str, version: int, latest: int) -> errors.IncompatibleStorage:
    return errors.IncompatibleStorage(
        f"{where} has treadle schema version {version}, newer than this treadle's {latest}; "
        "upgrade treadle to use it"
    )


async def check_schema(pool: _Fetcher, *, where: str = "the Postgres database") -> int:
    """The database's schema version; ``IncompatibleStorage`` unless it is this treadle's.

    ``pool`` is an asyncpg pool or connection.
    """
    latest = await asyncio.to_thread(latest_version)
    try:
        table = await pool.fetch("SELECT to_regclass($1) IS NOT NULL", VERSION_TABLE)
        rows = await pool.fetch(f"SELECT version FROM {VERSION_TABLE}") if table[0][0] else []
    except DRIVER_ERRORS as exc:
        raise map_error(exc, f"cannot read the schema version of {where}") from exc
    if not rows:
        raise errors.IncompatibleStorage(
            f"{where} has no treadle schema (version 0, this treadle needs {latest}); "
            "run `treadle migrate` to create it"
        )
    applied = {int(r[0]) for r in rows}
    current = max(applied, default=0)
    if current > latest:
        raise _ahead(where, current, latest)
    missing = sorted(set(range(1, latest + 1)) - applied)
    if missing:
        raise errors.IncompatibleStorage(
            f"{where} has treadle schema version {current}, behind this treadle's {latest} "
            f"(missing {', '.join(map(str, missing))}); run `treadle migrate` to upgrade it"
        )
    return current
