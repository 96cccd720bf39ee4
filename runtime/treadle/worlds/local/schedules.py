"""The local World's schedules table (``contract.Schedules``) on its SQLite database.

One statement (or one short transaction) per call on the database thread; ``update``
is ``UPDATE ... WHERE name = ? AND version = ?``, a compare-and-set. Built by
``world.LocalWorld``.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Any

from treadle import clock, errors
from treadle.world import records
from treadle.world.schedulerows import SchedulePuts, from_us, spec_from, spec_json, to_us
from treadle.worlds.local.database import Database, transaction

_COLUMNS = (
    "name, spec, paused, next_fire_at, last_fired_at, last_run_id, previous_run_id, "
    "buffered_at, skipped, missed, version, created_at, updated_at"
)


def _record(row: Any) -> records.ScheduleRecord:
    name, spec, paused = row[0], row[1], bool(row[2])
    state = records.ScheduleState(
        paused=paused,
        next_fire_at=from_us(row[3]),
        last_fired_at=from_us(row[4]),
        last_run_id=row[5],
        previous_run_id=row[6],
        buffered_at=from_us(row[7]),
        skipped=row[8],
        missed=row[9],
    )
    created, updated = from_us(row[11]), from_us(row[12])
    assert created is not None
    assert updated is not None
    return records.ScheduleRecord(spec_from(name, spec, paused), state, row[10], created, updated)


class LocalSchedules(SchedulePuts):
    def __init__(self, db: Database) -> None:
        self._db = db

    async def _put(
        self,
        spec: records.ScheduleSpec,
        next_fire_at: datetime | None,
        expected_version: int | None,
    ) -> records.ScheduleRecord | None:
        now = to_us(clock.utcnow())
        values = (spec.name, spec_json(spec), int(spec.paused), to_us(next_fire_at), now, now)

        def upsert(conn: sqlite3.Connection) -> Any:
            with transaction(conn):
                if expected_version is not None:
                    row = conn.execute(
                        "SELECT version FROM schedules WHERE name = ?", (spec.name,)
                    ).fetchone()
                    if expected_version != (0 if row is None else row[0]):
                        return None
                conn.execute(
                    "INSERT INTO schedules (name, spec, paused, next_fire_at, version, "
                    "created_at, updated_at) VALUES (?, ?, ?, ?, 1, ?, ?) "
                    "ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, paused = "
                    "excluded.paused, next_fire_at = excluded.next_fire_at, version = "
                    "schedules.version + 1, updated_at = excluded.updated_at",
                    values,
                )
                return conn.execute(
                    f"SELECT {_COLUMNS} FROM schedules WHERE name = ?", (spec.name,)
                ).fetchone()

        row = await self._db.call(upsert)
        return None if row is None else _record(row)

    async def get(self, name: str) -> records.ScheduleRecord:
        def query(conn: sqlite3.Connection) -> Any:
            return conn.execute(
                f"SELECT {_COLUMNS} FROM schedules WHERE name = ?", (name,)
            ).fetchone()

        row = await self._db.call(query)
        if row is None:
            raise errors.ScheduleNotFound(name)
        return _record(row)

    async def list(self, *, limit: int = 1000) -> list[records.ScheduleRecord]:
        def query(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(
                f"SELECT {_COLUMNS} FROM schedules ORDER BY name LIMIT ?", (limit,)
            ).fetchall()

        return [_record(row) for row in await self._db.call(query)]

    async def update(
        self, name: str, *, expected_version: int, state: records.ScheduleState
    ) -> records.ScheduleRecord | None:
        values = (
            int(state.paused), to_us(state.next_fire_at), to_us(state.last_fired_at),
            state.last_run_id, state.previous_run_id, to_us(state.buffered_at), state.skipped,
            state.missed, to_us(clock.utcnow()), name, expected_version,
        )  # fmt: skip

        def cas(conn: sqlite3.Connection) -> Any:
            with transaction(conn):
                changed = conn.execute(
                    "UPDATE schedules SET paused = ?, next_fire_at = ?, last_fired_at = ?, "
                    "last_run_id = ?, previous_run_id = ?, buffered_at = ?, skipped = ?, "
                    "missed = ?, updated_at = ?, version = version + 1 "
                    "WHERE name = ? AND version = ?",
                    values,
                ).rowcount
                if not changed:
                    return None
                return conn.execute(
                    f"SELECT {_COLUMNS} FROM schedules WHERE name = ?", (name,)
                ).fetchone()

        row = await self._db.call(cas)
        return None if row is None else _record(row)

    async def delete(self, name: str) -> bool:
        def remove(conn: sqlite3.Connection) -> bool:
            with transaction(conn):
                return conn.execute("DELETE FROM schedules WHERE name = ?", (name,)).rowcount > 0

        return bool(await self._db.call(remove))
