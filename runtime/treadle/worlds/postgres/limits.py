"""The Postgres World's concurrency and rate limits (migration 0012, ``limitrules``).

Each call is one statement: a function of migration 0012 that locks the key's row,
drops its dead holders and decides in one transaction, so every worker of the World
shares one count per key.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from treadle.world import limitrules as rules
from treadle.worlds.postgres.database import Database, Row


def _wakes(rows: list[Row]) -> list[rules.Wake]:
    return [
        rules.Wake(
            r["o_run_id"], r["o_holder"], r["o_wake"], rules.wake_key(r["o_holder"], r["o_arrival"])
        )
        for r in rows
    ]


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


class PostgresLimits:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def acquire(self, claim: rules.Claim, *, now_ms: int) -> rules.Admission:
        row = await self._db.fetchrow(
            "SELECT o_held, o_position "
            "FROM treadle_limit_acquire($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            claim.scope, claim.key, claim.max, claim.holder, claim.run_id, claim.kind,
            claim.priority, claim.wake, now_ms,
        )  # fmt: skip
        assert row is not None
        return rules.Admission(held=bool(row["o_held"]), position=int(row["o_position"]))

    async def reserve(self, claim: rules.RateClaim, *, now_ms: int) -> int:
        row = await self._db.fetchrow(
            "SELECT treadle_limit_reserve($1, $2, $3, $4, $5, $6, $7) AS at_ms",
            claim.scope, claim.key, claim.holder, claim.run_id, claim.interval_ms, claim.burst,
            now_ms,
        )  # fmt: skip
        assert row is not None
        return int(row["at_ms"])

    async def release(self, run_id: str, *, holder: str | None = None) -> list[rules.Wake]:
        return _wakes(
            await self._db.fetch("SELECT * FROM treadle_limit_release($1, $2)", run_id, holder)
        )

    async def sweep(self, *, now_ms: int, limit: int = 100) -> list[rules.Wake]:
        return _wakes(await self._db.fetch("SELECT * FROM treadle_limit_sweep($1)", limit))

    async def waiting(self, run_ids: Sequence[str], *, now_ms: int) -> dict[str, rules.WaitingOn]:
        ids = list(run_ids)
        out: dict[str, rules.WaitingOn] = {}
        for r in await self._db.fetch(
            "SELECT DISTINCT ON (run_id) run_id, scope, key, holder, at_ms "
            "FROM treadle_limit_reservations WHERE run_id = ANY($1) AND at_ms > $2",
            ids, now_ms,
        ):  # fmt: skip
            out[r["run_id"]] = rules.WaitingOn(
                r["run_id"], "rate", r["scope"], r["key"], r["holder"], until=_at(r["at_ms"])
            )
        for r in await self._db.fetch(
            "SELECT DISTINCT ON (w.run_id) w.run_id, w.scope, w.key, w.holder, w.priority, "
            "w.since_ms, (SELECT count(*) FROM treadle_limit_waiters o "
            " WHERE o.scope = w.scope AND o.key = w.key AND (o.priority > w.priority "
            " OR (o.priority = w.priority AND o.arrival < w.arrival))) AS ahead "
            "FROM treadle_limit_waiters w WHERE w.run_id = ANY($1)",
            ids,
        ):
            out[r["run_id"]] = rules.WaitingOn(
                r["run_id"], "concurrency", r["scope"], r["key"], r["holder"], r["priority"],
                int(r["ahead"]) + 1, since=_at(r["since_ms"]),
            )  # fmt: skip
        return out
