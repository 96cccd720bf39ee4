"""Step heartbeats in the Postgres World (issue 17 item 5): one row per step in
``treadle_step_heartbeats`` (migration 0012), upserted, never the log."""

from __future__ import annotations

import json
from datetime import datetime

from pydantic import JsonValue

from treadle.world import records
from treadle.worlds.postgres.database import Database


class PostgresHeartbeats:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def record(
        self, run_id: str, step_id: str, *, attempt: int, details: JsonValue, beat_at: datetime
    ) -> None:
        await self._db.fetchrow(
            "INSERT INTO treadle_step_heartbeats AS h (run_id, step_id, attempt, details, beat_at) "
            "VALUES ($1, $2, $3, $4::jsonb, $5) ON CONFLICT (run_id, step_id) DO UPDATE SET "
            "attempt = EXCLUDED.attempt, details = EXCLUDED.details, beat_at = EXCLUDED.beat_at "
            "WHERE EXCLUDED.attempt >= h.attempt",
            run_id,
            step_id,
            attempt,
            json.dumps(details),
            beat_at,
        )

    async def get(self, run_id: str, step_id: str) -> records.HeartbeatRecord | None:
        row = await self._db.fetchrow(
            "SELECT attempt, details::text AS details, beat_at FROM treadle_step_heartbeats "
            "WHERE run_id = $1 AND step_id = $2",
            run_id,
            step_id,
        )
        if row is None:
            return None
        return records.HeartbeatRecord(
            run_id, step_id, row["attempt"], json.loads(row["details"]), row["beat_at"]
        )
