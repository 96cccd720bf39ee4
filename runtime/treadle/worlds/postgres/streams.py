"""The Postgres World's streams (``contract.Streams``): migration 0012's tables, one
statement per call (``treadle_stream_append`` decides and stores an append in one
transaction; a read is one query, so its page and counts are one snapshot).

Live readers: an append NOTIFYs ``treadle_streams`` with ``run_id name``, from any
process. ``StreamListener`` holds one LISTEN connection per World, opened by the
first ``subscribe``; appends made through this World are also announced at once.
A lost listener is reopened by the next ``subscribe``; meanwhile the reader's poll
(``TREADLE_STREAM_POLL_SECONDS``) finds what it missed. Built by ``PostgresStorage``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any, cast

import asyncpg
from pydantic import JsonValue

from treadle import errors
from treadle.world import contract, records, streamrules
from treadle.worlds.postgres.database import DRIVER_ERRORS, Database, describe

log = logging.getLogger("treadle.worlds.postgres.streams")

CHANNEL = "treadle_streams"
_APPEND_SQL = "SELECT * FROM treadle_stream_append($1, $2, $3, $4, $5, $6::jsonb, $7)"
_READ_SQL = """
SELECT r.status::text, s.count, s.closed, c.idx, c.data::text, c.step_id, c.attempt, c.seq,
    c.created_at
FROM treadle_runs r
LEFT JOIN treadle_streams s ON s.run_id = r.run_id AND s.name = $2
LEFT JOIN LATERAL (
    SELECT idx, data, step_id, attempt, seq, created_at FROM treadle_stream_chunks
    WHERE run_id = r.run_id AND name = $2 AND idx >= $3 ORDER BY idx LIMIT $4
) c ON true
WHERE r.run_id = $1
ORDER BY c.idx
"""
_LIST_SQL = """
SELECT r.run_id, s.name, s.count, s.closed FROM treadle_runs r
LEFT JOIN treadle_streams s ON s.run_id = r.run_id
WHERE r.run_id = $1 ORDER BY s.name
"""


class StreamListener:
    """One LISTEN connection feeding this process's stream subscriptions."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self.waiters = streamrules.Waiters()
        self._conn: Any = None
        self._opening: asyncio.Task[None] | None = None
        self._closed = False

    def ensure(self) -> None:
        if self._closed or self._conn is not None:
            return
        if self._opening is None or self._opening.done():
            self._opening = asyncio.get_running_loop().create_task(
                self._open(), name="treadle-pg-stream-listener"
            )

    async def _open(self) -> None:
        try:
            conn = await asyncpg.connect(
                self._dsn, server_settings={"application_name": "treadle-stream-listener"}
            )
            await conn.add_listener(CHANNEL, self._on_notify)
        except DRIVER_ERRORS as exc:
            log.warning(
                "stream notifications from %s are off (%s); readers poll", describe(self._dsn), exc
            )
            return
        if self._closed:
            await conn.close()
            return
        conn.add_termination_listener(self._on_terminated)
        self._conn = conn

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        run_id, _, name = payload.partition(" ")
        if run_id and name:
            self.waiters.notify(run_id, name)

    def _on_terminated(self, conn: object) -> None:
        if conn is self._conn:
            log.warning("the stream LISTEN connection was lost; readers poll until it is back")
            self._conn = None

    async def close(self) -> None:
        self._closed = True
        self.waiters.close()
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close(timeout=5)
            except DRIVER_ERRORS:
                conn.terminate()


class PostgresStreams:
    def __init__(self, db: Database) -> None:
        self._db = db
        self.listener = StreamListener(db.dsn)

    async def append(
        self,
        run_id: str,
        name: str,
        chunks: Sequence[JsonValue],
        *,
        step_id: str,
        attempt: int,
        first_seq: int,
        close: bool = False,
    ) -> records.StreamAppend:
        streamrules.check_append_args(
            name, chunks, attempt=attempt, first_seq=first_seq, close=close
        )
        data = json.dumps(list(chunks), separators=(",", ":"), ensure_ascii=False)
        row = await self._db.fetchrow(
            _APPEND_SQL, run_id, name, step_id, attempt, first_seq, data, close
        )
        assert row is not None
        code = row["o_code"]
        if code == "no_run":
            raise errors.RunNotFound(run_id)
        if code == "replayed":
            return records.StreamAppend(0, 0, bool(row["o_closed"]), replayed=True)
        if code == "refused":
            state = streamrules.AppendState(
                run_id=run_id,
                name=name,
                run_ended=bool(row["o_run_ended"]),
                step_attempt=row["o_step_attempt"],
                closed=bool(row["o_closed"]),
                stored=int(row["o_stored"]),
            )
            streamrules.decide(
                state, attempt=attempt, first_seq=first_seq, count=len(chunks), close=close
            )  # raises the refusal
            raise errors.WorldContractError(f"run {run_id}: stream append refused: {state}")
        self.listener.waiters.notify(run_id, name)
        return records.StreamAppend(
            int(row["o_first_index"]), int(row["o_count"]), bool(row["o_closed"])
        )

    async def read(
        self, run_id: str, name: str, *, start: int = 0, limit: int = 1000
    ) -> records.StreamPage:
        streamrules.check_read_args(name, start, limit)
        rows = await self._db.fetch(_READ_SQL, run_id, name, start, limit)
        if not rows:
            raise errors.RunNotFound(run_id)
        first = rows[0]
        chunks = tuple(
            records.StreamChunk(
                index=int(row[3]),
                data=cast(JsonValue, json.loads(row[4])),
                step_id=str(row[5]),
                attempt=int(row[6]),
                seq=int(row[7]),
                created_at=row[8],
            )
            for row in rows
            if row[3] is not None
        )
        return records.StreamPage(
            chunks=chunks,
            count=int(first[1] or 0),
            closed=bool(first[2]),
            run_ended=first[0] in records.TERMINAL_RUN_STATUSES,
        )

    async def list(self, run_id: str) -> list[records.StreamInfo]:
        rows = await self._db.fetch(_LIST_SQL, run_id)
        if not rows:
            raise errors.RunNotFound(run_id)
        return [
            records.StreamInfo(str(r[1]), int(r[2]), bool(r[3])) for r in rows if r[1] is not None
        ]

    def subscribe(
        self, run_id: str, name: str, on_append: contract.StreamCallback
    ) -> contract.Subscription:
        self.listener.ensure()
        return self.listener.waiters.add(run_id, name, on_append)

    async def close(self) -> None:
        await self.listener.close()
