"""The Postgres World's schedules table (``contract.Schedules``, migration 0012).

Each call is one statement; ``update`` is a compare-and-set on ``version`` (``UPDATE
... WHERE name = $1 AND version = $2 RETURNING``), so of two schedulers that read one
version exactly one writes. Built by ``PostgresStorage``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from treadle import clock, errors
from treadle.world import records
from treadle.world.schedulerows import SchedulePuts, spec_from, spec_json
from treadle.worlds.postgres.database import Database, Row

_COLUMNS = (
    "name, spec::text, paused, next_fire_at, last_fired_at, last_run_id, previous_run_id, "
    "buffered_at, skipped, missed, version, created_at, updated_at"
)


def _record(row: Row) -> records.ScheduleRecord:
    name, paused = row[0], bool(row[2])
    state = records.ScheduleState(
        paused=paused,
        next_fire_at=row[3],
        last_fired_at=row[4],
        last_run_id=row[5],
        previous_run_id=row[6],
        buffered_at=row[7],
        skipped=int(row[8]),
        missed=int(row[9]),
    )
    return records.ScheduleRecord(
        spec_from(name, row[1], paused), state, int(row[10]), row[11], row[12]
    )


class PostgresSchedules(SchedulePuts):
    def __init__(self, db: Database) -> None:
        self._db = db

    async def _put(
        self,
        spec: records.ScheduleSpec,
        next_fire_at: datetime | None,
        expected_version: int | None,
    ) -> records.ScheduleRecord | None:
        values = (spec.name, spec_json(spec), spec.paused, next_fire_at, clock.utcnow())
        if expected_version == 0:
            row = await self._db.fetchrow(
                "INSERT INTO treadle_schedules (name, spec, paused, next_fire_at, version, "
                "created_at, updated_at) VALUES ($1, $2::jsonb, $3, $4, 1, $5, $5) "
                f"ON CONFLICT (name) DO NOTHING RETURNING {_COLUMNS}",
                *values,
            )
            return None if row is None else _record(row)
        if expected_version is not None:
            row = await self._db.fetchrow(
                "UPDATE treadle_schedules SET spec = $2::jsonb, paused = $3, next_fire_at = $4, "
                "version = version + 1, updated_at = $5 WHERE name = $1 AND version = $6 "
                f"RETURNING {_COLUMNS}",
                *values, expected_version,
            )  # fmt: skip
            return None if row is None else _record(row)
        row = await self._db.fetchrow(
            "INSERT INTO treadle_schedules AS s (name, spec, paused, next_fire_at, version, "
            "created_at, updated_at) VALUES ($1, $2::jsonb, $3, $4, 1, $5, $5) "
            "ON CONFLICT (name) DO UPDATE SET spec = EXCLUDED.spec, paused = EXCLUDED.paused, "
            "next_fire_at = EXCLUDED.next_fire_at, version = s.version + 1, "
            f"updated_at = EXCLUDED.updated_at RETURNING {_COLUMNS}",
            spec.name, spec_json(spec), spec.paused, next_fire_at, clock.utcnow(),
        )  # fmt: skip
        assert row is not None
        return _record(row)

    async def get(self, name: str) -> records.ScheduleRecord:
        row = await self._db.fetchrow(
            f"SELECT {_COLUMNS} FROM treadle_schedules WHERE name = $1", name
        )
        if row is None:
            raise errors.ScheduleNotFound(name)
        return _record(row)

    async def list(self, *, limit: int = 1000) -> list[records.ScheduleRecord]:
        found = await self._db.fetch(
            f"SELECT {_COLUMNS} FROM treadle_schedules ORDER BY name LIMIT $1", limit
        )
        return [_record(row) for row in found]

    async def update(
        self, name: str, *, expected_version: int, state: records.ScheduleState
    ) -> records.ScheduleRecord | None:
        args: tuple[Any, ...] = (
            name, expected_version, state.paused, state.next_fire_at, state.last_fired_at,
            state.last_run_id, state.previous_run_id, state.buffered_at, state.skipped,
            state.missed, clock.utcnow(),
        )  # fmt: skip
        row = await self._db.fetchrow(
            "UPDATE treadle_schedules SET paused = $3, next_fire_at = $4, last_fired_at = $5, "
            "last_run_id = $6, previous_run_id = $7, buffered_at = $8, skipped = $9, "
            "missed = $10, updated_at = $11, version = version + 1 "
            f"WHERE name = $1 AND version = $2 RETURNING {_COLUMNS}",
            *args,
        )
        return None if row is None else _record(row)

    async def delete(self, name: str) -> bool:
        found = await self._db.fetch(
            "DELETE FROM treadle_schedules WHERE name = $1 RETURNING name", name
        )
        return bool(found)
