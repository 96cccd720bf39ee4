"""The local World's streams (``contract.Streams``) in its SQLite file: ``streams`` (one
row per stream: its chunk count and whether it is closed) and ``stream_chunks``
(schema.sql, upgrade 5).

An append is one write transaction on the database thread: it reads the run's
status, the step's latest attempt, the stream's row and the attempt's stored
chunks, decides with ``streamrules.decide`` and inserts. Subscribers in this
process hear an append at once; another process's appends are found by the
reader's poll (``TREADLE_STREAM_POLL_SECONDS``). Built by ``LocalWorld``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import cast

from pydantic import JsonValue

from treadle import errors
from treadle.world import contract, records, streamrules
from treadle.worlds.local.database import Database, now_us, transaction
from treadle.worlds.local.eventlog import from_us

_TERMINAL = tuple(sorted(records.TERMINAL_RUN_STATUSES))


def _run_ended(conn: sqlite3.Connection, run_id: str) -> bool:
    row = conn.execute("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    if row is None:
        raise errors.RunNotFound(run_id)
    return str(row[0]) in _TERMINAL


def _stream(conn: sqlite3.Connection, run_id: str, name: str) -> tuple[int, bool]:
    row = conn.execute(
        "SELECT count, closed FROM streams WHERE run_id = ? AND name = ?", (run_id, name)
    ).fetchone()
    return (0, False) if row is None else (int(row[0]), bool(row[1]))


class LocalStreams:
    def __init__(self, db: Database) -> None:
        self._db = db
        self.waiters = streamrules.Waiters()

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
        texts = [json.dumps(c, separators=(",", ":"), ensure_ascii=False) for c in chunks]

        def write(conn: sqlite3.Connection) -> records.StreamAppend:
            with transaction(conn):
                run_ended = _run_ended(conn, run_id)
                step = conn.execute(
                    "SELECT attempt FROM steps WHERE run_id = ? AND step_id = ?",
                    (run_id, step_id),
                ).fetchone()
                count, closed = _stream(conn, run_id, name)
                stored = conn.execute(
                    "SELECT COALESCE(MAX(seq) + 1, 0) FROM stream_chunks WHERE run_id = ? "
                    "AND name = ? AND step_id = ? AND attempt = ?",
                    (run_id, name, step_id, attempt),
                ).fetchone()[0]
                state = streamrules.AppendState(
                    run_id=run_id,
                    name=name,
                    run_ended=run_ended,
                    step_attempt=None if step is None else int(step[0]),
                    closed=closed,
                    stored=int(stored),
                )
                fate = streamrules.decide(
                    state, attempt=attempt, first_seq=first_seq, count=len(texts), close=close
                )
                if fate == "replayed":
                    return records.StreamAppend(0, 0, closed, replayed=True)
                at = now_us()
                conn.executemany(
                    "INSERT INTO stream_chunks (run_id, name, idx, step_id, attempt, seq, "
                    "data, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (run_id, name, count + i, step_id, attempt, first_seq + i, text, at)
                        for i, text in enumerate(texts)
                    ],
                )
                conn.execute(
                    "INSERT INTO streams (run_id, name, count, closed) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (run_id, name) DO UPDATE SET count = excluded.count, "
                    "closed = excluded.closed",
                    (run_id, name, count + len(texts), int(closed or close)),
                )
                return records.StreamAppend(count, len(texts), closed or close)

        result = await self._db.call(write)
        self.waiters.notify(run_id, name)
        return result

    async def read(
        self, run_id: str, name: str, *, start: int = 0, limit: int = 1000
    ) -> records.StreamPage:
        streamrules.check_read_args(name, start, limit)

        def read(conn: sqlite3.Connection) -> records.StreamPage:
            run_ended = _run_ended(conn, run_id)
            count, closed = _stream(conn, run_id, name)
            rows = conn.execute(
                "SELECT idx, data, step_id, attempt, seq, created_at FROM stream_chunks "
                "WHERE run_id = ? AND name = ? AND idx >= ? ORDER BY idx LIMIT ?",
                (run_id, name, start, limit),
            ).fetchall()
            chunks = tuple(
                records.StreamChunk(
                    index=int(row[0]),
                    data=cast(JsonValue, json.loads(row[1])),
                    step_id=str(row[2]),
                    attempt=int(row[3]),
                    seq=int(row[4]),
                    created_at=from_us(int(row[5])),
                )
                for row in rows
            )
            return records.StreamPage(chunks, count, closed, run_ended)

        # One read transaction: the run, the stream and its chunks from one snapshot.
        def snapshot(conn: sqlite3.Connection) -> records.StreamPage:
            if conn.in_transaction:
                return read(conn)
            conn.execute("BEGIN")
            try:
                return read(conn)
            finally:
                conn.execute("COMMIT")

        return await self._db.call(snapshot)

    async def list(self, run_id: str) -> list[records.StreamInfo]:
        def read(conn: sqlite3.Connection) -> list[records.StreamInfo]:
            _run_ended(conn, run_id)
            rows = conn.execute(
                "SELECT name, count, closed FROM streams WHERE run_id = ? ORDER BY name",
                (run_id,),
            ).fetchall()
            return [records.StreamInfo(str(r[0]), int(r[1]), bool(r[2])) for r in rows]

        return await self._db.call(read)

    def subscribe(
        self, run_id: str, name: str, on_append: contract.StreamCallback
    ) -> contract.Subscription:
        return self.waiters.add(run_id, name, on_append)
