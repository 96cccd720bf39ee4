"""Step heartbeats in the local World (issue 17 item 5): one row per step,
``step_heartbeats``, upserted, never the log (``contract.Heartbeats``)."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime

from pydantic import JsonValue

from treadle.world import records
from treadle.worlds.local.database import Database, transaction


class LocalHeartbeats:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def record(
        self, run_id: str, step_id: str, *, attempt: int, details: JsonValue, beat_at: datetime
    ) -> None:
        text = json.dumps(details)
        at_us = int(beat_at.timestamp() * 1_000_000)

        def upsert(conn: sqlite3.Connection) -> None:
            with transaction(conn):
                conn.execute(
                    "INSERT INTO step_heartbeats (run_id, step_id, attempt, details, beat_at) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_id, step_id) DO UPDATE SET "
                    "attempt = excluded.attempt, details = excluded.details, "
                    "beat_at = excluded.beat_at WHERE excluded.attempt >= step_heartbeats.attempt",
                    (run_id, step_id, attempt, text, at_us),
                )

        await self._db.call(upsert)

    async def get(self, run_id: str, step_id: str) -> records.HeartbeatRecord | None:
        def query(conn: sqlite3.Connection) -> tuple[object, ...] | None:
            row: tuple[object, ...] | None = conn.execute(
                "SELECT attempt, details, beat_at FROM step_heartbeats "
                "WHERE run_id = ? AND step_id = ?",
                (run_id, step_id),
            ).fetchone()
            return row

        row = await self._db.call(query)
        if row is None:
            return None
        attempt, details, beat_at = row
        assert isinstance(attempt, int)
        assert isinstance(details, str)
        assert isinstance(beat_at, int)
        return records.HeartbeatRecord(
            run_id,
            step_id,
            attempt,
            json.loads(details),
            datetime.fromtimestamp(beat_at / 1_000_000, tz=UTC),
        )
