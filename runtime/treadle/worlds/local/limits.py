"""The local World's concurrency and rate limits (``treadle.world.limitrules``).

Four tables (schema version 5): ``limit_holders``, ``limit_waiters``,
``limit_buckets`` and ``limit_reservations``. Every call is one ``BEGIN
IMMEDIATE`` transaction on the database thread: SQLite's single writer makes
the count-and-insert of an acquire atomic against every other process that
opened the World (the CLI beside a worker). A holder is dead when its run
ended or its step has its outcome (the ``runs`` and ``steps`` views, same
transaction).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime

from treadle.world import limitrules as rules
from treadle.worlds.local.database import Database, transaction

# A holder (or waiter) row of table T is dead: its run ended, or its step has its outcome.
_DEAD = """(
    NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = {t}.run_id
                AND r.status NOT IN ('completed', 'failed', 'cancelled'))
    OR ({t}.kind = 'step' AND EXISTS (
        SELECT 1 FROM steps s WHERE s.run_id = {t}.run_id
        AND s.step_id = substr({t}.holder, length({t}.run_id) + 2)
        AND s.status IN ('completed', 'failed')))
)"""


def _purge(conn: sqlite3.Connection, scope: str | None = None, key: str | None = None) -> None:
    where = "" if scope is None else "scope = ? AND key = ? AND "
    args: tuple[str, ...] = () if scope is None or key is None else (scope, key)
    for table in ("limit_holders", "limit_waiters"):
        conn.execute(f"DELETE FROM {table} WHERE {where}{_DEAD.format(t=table)}", args)


def _next_arrival(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT value FROM treadle_meta WHERE key = 'limit_arrival'").fetchone()
    arrival = int(row[0]) + 1 if row is not None else 1
    conn.execute(
        "INSERT INTO treadle_meta (key, value) VALUES ('limit_arrival', ?) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (str(arrival),),
    )
    return arrival


def _acquire(conn: sqlite3.Connection, claim: rules.Claim, now_ms: int) -> rules.Admission:
    with transaction(conn):
        _purge(conn, claim.scope, claim.key)
        k = (claim.scope, claim.key)
        if conn.execute(
            "SELECT 1 FROM limit_holders WHERE scope = ? AND key = ? AND holder = ?",
            (*k, claim.holder),
        ).fetchone():
            return rules.Admission(held=True)
        (holders,) = conn.execute(
            "SELECT count(*) FROM limit_holders WHERE scope = ? AND key = ?", k
        ).fetchone()
        mine = conn.execute(
            "SELECT priority, arrival FROM limit_waiters "
            "WHERE scope = ? AND key = ? AND holder = ?",
            (*k, claim.holder),
        ).fetchone()
        priority, arrival = (mine[0], mine[1]) if mine else (claim.priority, _next_arrival(conn))
        (ahead,) = conn.execute(
            "SELECT count(*) FROM limit_waiters WHERE scope = ? AND key = ? AND holder != ? "
            "AND (priority > ? OR (priority = ? AND arrival < ?))",
            (*k, claim.holder, priority, priority, arrival),
        ).fetchone()
        if rules.admits(holders, claim.max, ahead):
            conn.execute(
                "DELETE FROM limit_waiters WHERE scope = ? AND key = ? AND holder = ?",
                (*k, claim.holder),
            )
            conn.execute(
                "INSERT INTO limit_holders (scope, key, holder, run_id, kind, since_ms) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (*k, claim.holder, claim.run_id, claim.kind, now_ms),
            )
            return rules.Admission(held=True)
        if not mine:
            conn.execute(
                "INSERT INTO limit_waiters (scope, key, holder, run_id, kind, priority, arrival, "
                "since_ms, max, wake) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*k, claim.holder, claim.run_id, claim.kind, priority, arrival, now_ms,
                 claim.max, claim.wake),
            )  # fmt: skip
        return rules.Admission(held=False, position=ahead + 1)


def _reserve(conn: sqlite3.Connection, claim: rules.RateClaim, now_ms: int) -> int:
    with transaction(conn):
        k = (claim.scope, claim.key)
        row = conn.execute(
            "SELECT at_ms FROM limit_reservations WHERE scope = ? AND key = ? AND holder = ?",
            (*k, claim.holder),
        ).fetchone()
        if row is not None:
            return int(row[0])
        tat = conn.execute(
            "SELECT tat_ms FROM limit_buckets WHERE scope = ? AND key = ?", k
        ).fetchone()
        got = rules.reservation(tat[0] if tat else None, now_ms, claim.interval_ms, claim.burst)
        conn.execute(
            "INSERT INTO limit_buckets (scope, key, tat_ms) VALUES (?, ?, ?) "
            "ON CONFLICT (scope, key) DO UPDATE SET tat_ms = excluded.tat_ms",
            (*k, got.tat_ms),
        )
        conn.execute(
            "INSERT INTO limit_reservations (scope, key, holder, run_id, at_ms) "
            "VALUES (?, ?, ?, ?, ?)",
            (*k, claim.holder, claim.run_id, got.at_ms),
        )
        return got.at_ms


def _admissible(conn: sqlite3.Connection, scope: str, key: str) -> list[rules.Wake]:
    _purge(conn, scope, key)
    head = conn.execute(
        "SELECT holder, run_id, arrival, wake, max FROM limit_waiters WHERE scope = ? AND key = ? "
        "ORDER BY priority DESC, arrival LIMIT 1000",
        (scope, key),
    ).fetchall()
    if not head:
        return []
    (holders,) = conn.execute(
        "SELECT count(*) FROM limit_holders WHERE scope = ? AND key = ?", (scope, key)
    ).fetchone()
    free = rules.admissible(holders, head[0][4])
    return [rules.Wake(r[1], r[0], r[3], rules.wake_key(r[0], r[2])) for r in head[:free]]


def _release(conn: sqlite3.Connection, run_id: str, holder: str | None) -> list[rules.Wake]:
    with transaction(conn):
        col, value = ("holder", holder) if holder is not None else ("run_id", run_id)
        keys = conn.execute(
            f"SELECT DISTINCT scope, key FROM limit_holders WHERE {col} = ?", (value,)
        ).fetchall()
        for table in ("limit_holders", "limit_waiters", "limit_reservations"):
            conn.execute(f"DELETE FROM {table} WHERE {col} = ?", (value,))
        wakes: list[rules.Wake] = []
        for scope, key in sorted(keys):
            wakes += _admissible(conn, scope, key)
        return wakes


def _sweep(conn: sqlite3.Connection, limit: int) -> list[rules.Wake]:
    with transaction(conn):
        _purge(conn)
        keys = conn.execute("SELECT DISTINCT scope, key FROM limit_waiters").fetchall()
        wakes: list[rules.Wake] = []
        for scope, key in sorted(keys):
            wakes += _admissible(conn, scope, key)
            if len(wakes) >= limit:
                break
        return wakes[:limit]


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _waiting(
    conn: sqlite3.Connection, run_ids: Sequence[str], now_ms: int
) -> dict[str, rules.WaitingOn]:
    out: dict[str, rules.WaitingOn] = {}
    for run_id in run_ids:
        row = conn.execute(
            "SELECT scope, key, holder, at_ms FROM limit_reservations "
            "WHERE run_id = ? AND at_ms > ? LIMIT 1",
            (run_id, now_ms),
        ).fetchone()
        if row is not None:
            out[run_id] = rules.WaitingOn(run_id, "rate", row[0], row[1], row[2], until=_at(row[3]))
        row = conn.execute(
            "SELECT w.scope, w.key, w.holder, w.priority, w.since_ms, "
            "(SELECT count(*) FROM limit_waiters o WHERE o.scope = w.scope AND o.key = w.key "
            " AND (o.priority > w.priority OR (o.priority = w.priority AND o.arrival < w.arrival)))"
            " FROM limit_waiters w WHERE w.run_id = ? LIMIT 1",
            (run_id,),
        ).fetchone()
        if row is not None:
            out[run_id] = rules.WaitingOn(
                run_id, "concurrency", row[0], row[1], row[2], row[3], row[5] + 1,
                since=_at(row[4]),
            )  # fmt: skip
    return out


class LocalLimits:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def acquire(self, claim: rules.Claim, *, now_ms: int) -> rules.Admission:
        return await self._db.call(lambda conn: _acquire(conn, claim, now_ms))

    async def reserve(self, claim: rules.RateClaim, *, now_ms: int) -> int:
        return await self._db.call(lambda conn: _reserve(conn, claim, now_ms))

    async def release(self, run_id: str, *, holder: str | None = None) -> list[rules.Wake]:
        return await self._db.call(lambda conn: _release(conn, run_id, holder))

    async def sweep(self, *, now_ms: int, limit: int = 100) -> list[rules.Wake]:
        return await self._db.call(lambda conn: _sweep(conn, limit))

    async def waiting(self, run_ids: Sequence[str], *, now_ms: int) -> dict[str, rules.WaitingOn]:
        return await self._db.call(lambda conn: _waiting(conn, list(run_ids), now_ms))
