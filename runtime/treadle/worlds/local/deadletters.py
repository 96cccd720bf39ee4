"""The local World's dead letters: queue messages moved aside, kept until requeued or dropped.

``move`` runs inside ``queue.settle`` (a handler raised on the tuning's
``max_failed_deliveries``-th delivery) and ``dispatch`` (a payload that is not
a treadle message, at once). ``listing``, ``requeue`` and ``drop`` serve
``LocalQueue``'s ``contract.DeadLetters`` methods, for ``treadle dead-letters``.
Every function runs on the database thread.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

import pydantic

from treadle import errors
from treadle.world import messages, records, routing
from treadle.worlds.local.database import now_us, transaction

_US = 1_000_000
MAX_ERROR_CHARS = 2000


def move(
    conn: sqlite3.Connection,
    *,
    message_id: str,
    kind: str,
    payload: str,
    delivery_count: int,
    error: str,
    now: int,
) -> None:
    """Move a leased message to the dead letters (in the caller's transaction)."""
    row = conn.execute(
        "SELECT run_id FROM queue_messages WHERE message_id = ?", (message_id,)
    ).fetchone()
    run_id = "" if row is None else row[0]
    conn.execute(
        "INSERT OR REPLACE INTO queue_dead_letters (message_id, kind, run_id, payload, "
        "delivery_count, last_error, dead_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (message_id, kind, run_id, payload, delivery_count, error[:MAX_ERROR_CHARS], now),
    )
    conn.execute("DELETE FROM queue_messages WHERE message_id = ?", (message_id,))


def move_unreadable(
    conn: sqlite3.Connection, *, message_id: str, token: str, payload: str, error: str
) -> bool:
    """A leased payload that is not a treadle message: dead at once (it never will be)."""
    with transaction(conn):
        row = conn.execute(
            "SELECT delivery_count FROM queue_messages WHERE message_id = ? AND lease_token = ?",
            (message_id, token),
        ).fetchone()
        if row is None:
            return False
        move(
            conn,
            message_id=message_id,
            kind="unknown",
            payload=payload,
            delivery_count=int(row[0]),
            error=error,
            now=now_us(),
        )
        return True


def listing(conn: sqlite3.Connection, limit: int) -> list[records.DeadLetter]:
    rows = conn.execute(
        "SELECT message_id, kind, run_id, delivery_count, last_error, dead_at "
        "FROM queue_dead_letters ORDER BY dead_at, message_id LIMIT ?",
        (limit,),
    ).fetchall()
    return [
        records.DeadLetter(
            message_id=message_id,
            kind=kind,
            run_id=run_id or None,
            deliveries=int(count),
            error=error or "",
            dead_at=datetime.fromtimestamp(dead_at / _US, UTC),
        )
        for message_id, kind, run_id, count, error, dead_at in rows
    ]


def requeue(conn: sqlite3.Connection, message_id: str) -> None:
    """Send a dead letter again under its message id: ready now, its counts from zero."""
    with transaction(conn):
        row = conn.execute(
            "SELECT kind, run_id, payload FROM queue_dead_letters WHERE message_id = ?",
            (message_id,),
        ).fetchone()
        if row is None:
            raise errors.DeadLetterNotFound(message_id)
        kind, run_id, payload = row
        gate = None
        try:
            message = messages.MESSAGE_ADAPTER.validate_json(payload)
        except pydantic.ValidationError:
            pass  # still unreadable: it will come straight back here
        else:
            kind = message.kind
            version = None
            if isinstance(message, messages.OrchestratorMessage) and message.spec_version is None:
                found = conn.execute(
                    "SELECT spec_version FROM runs WHERE run_id = ?", (message.run_id,)
                ).fetchone()
                version = None if found is None else int(found[0])
            gate = routing.gated_run_id(message, version)
        now = now_us()
        back = conn.execute("SELECT COALESCE(MAX(line), 0) + 1 FROM queue_messages")
        conn.execute(
            "INSERT INTO queue_messages (message_id, kind, run_id, gate_run_id, payload, state, "
            "available_at, line, first_sent_at) VALUES (?, ?, ?, ?, ?, 'ready', ?, ?, ?)",
            (message_id, kind, run_id, gate, payload, now, back.fetchone()[0], now),
        )
        conn.execute("DELETE FROM queue_dead_letters WHERE message_id = ?", (message_id,))


def drop(conn: sqlite3.Connection, message_id: str) -> None:
    with transaction(conn):
        cur = conn.execute("DELETE FROM queue_dead_letters WHERE message_id = ?", (message_id,))
        if cur.rowcount == 0:
            raise errors.DeadLetterNotFound(message_id)
