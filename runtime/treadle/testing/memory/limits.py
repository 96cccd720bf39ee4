"""The memory World's concurrency and rate limits (``treadle.world.limitrules``).

The tables live on the ``MemoryBackend`` (``LimitTables``), so every MemoryWorld of
one backend (every simulated process) shares them; each call runs in one step of
the loop, which makes it one transaction. Times come from the caller (the World's
clock, virtual in the simulation).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from treadle.testing.memory.log import Store
from treadle.world import limitrules as rules

Key = tuple[str, str]


@dataclass
class Holder:
    run_id: str
    kind: rules.HolderKind
    since_ms: int


@dataclass
class Waiter:
    run_id: str
    kind: rules.HolderKind
    priority: int
    arrival: int
    since_ms: int
    maximum: int
    wake: str


@dataclass
class Reserved:
    run_id: str
    at_ms: int


@dataclass
class LimitTables:
    holders: dict[Key, dict[str, Holder]] = field(default_factory=dict)
    waiters: dict[Key, dict[str, Waiter]] = field(default_factory=dict)
    tat: dict[Key, int] = field(default_factory=dict)
    reserved: dict[tuple[str, str, str], Reserved] = field(default_factory=dict)
    arrivals: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    # (scope, key, holder) -> the most holders seen at once, for the simulation's checks.
    peak: dict[Key, int] = field(default_factory=dict)


def _ms(at: int) -> datetime:
    return datetime.fromtimestamp(at / 1000, tz=UTC)


class MemoryLimits:
    def __init__(self, store: Store, tables: LimitTables) -> None:
        self._store = store
        self._t = tables

    def _dead(self, holder: str, run_id: str) -> bool:
        state = self._store.runs.get(run_id)
        if state is None:
            return True
        step_ended = False
        if "/" in holder:
            step = state.steps.get(holder.split("/", 1)[1])
            step_ended = step is not None and step.status in ("completed", "failed")
        return rules.holder_dead(run_terminal=state.record.is_terminal, step_ended=step_ended)

    def _purge(self, key: Key) -> None:
        holders = self._t.holders.get(key, {})
        for name in [h for h, row in holders.items() if self._dead(h, row.run_id)]:
            del holders[name]
        waiters = self._t.waiters.get(key, {})
        for name in [w for w, row in waiters.items() if self._dead(w, row.run_id)]:
            del waiters[name]

    def _ranked(self, key: Key) -> list[tuple[str, Waiter]]:
        waiters = self._t.waiters.get(key, {})
        return sorted(waiters.items(), key=lambda kv: rules.rank_key(kv[1].priority, kv[1].arrival))

    async def acquire(self, claim: rules.Claim, *, now_ms: int) -> rules.Admission:
        key = (claim.scope, claim.key)
        self._purge(key)
        holders = self._t.holders.setdefault(key, {})
        if claim.holder in holders:
            return rules.Admission(held=True)
        waiters = self._t.waiters.setdefault(key, {})
        mine = waiters.get(claim.holder)
        arrival = mine.arrival if mine is not None else next(self._t.arrivals)
        priority = mine.priority if mine is not None else claim.priority
        me = rules.rank_key(priority, arrival)
        ahead = sum(
            1
            for name, w in waiters.items()
            if name != claim.holder and rules.rank_key(w.priority, w.arrival) < me
        )
        if rules.admits(len(holders), claim.max, ahead):
            waiters.pop(claim.holder, None)
            holders[claim.holder] = Holder(claim.run_id, claim.kind, now_ms)
            self._t.peak[key] = max(self._t.peak.get(key, 0), len(holders))
            return rules.Admission(held=True)
        if mine is None:
            waiters[claim.holder] = Waiter(
                claim.run_id, claim.kind, priority, arrival, now_ms, claim.max, claim.wake
            )
        return rules.Admission(held=False, position=ahead + 1)

    async def reserve(self, claim: rules.RateClaim, *, now_ms: int) -> int:
        key = (claim.scope, claim.key)
        mine = self._t.reserved.get((claim.scope, claim.key, claim.holder))
        if mine is not None:
            return mine.at_ms
        got = rules.reservation(self._t.tat.get(key), now_ms, claim.interval_ms, claim.burst)
        self._t.tat[key] = got.tat_ms
        self._t.reserved[(claim.scope, claim.key, claim.holder)] = Reserved(claim.run_id, got.at_ms)
        return got.at_ms

    def _mine(self, run_id: str, holder: str | None, name: str, row_run: str) -> bool:
        return name == holder if holder is not None else row_run == run_id

    async def release(self, run_id: str, *, holder: str | None = None) -> list[rules.Wake]:
        touched: set[Key] = set()
        for key, holders in self._t.holders.items():
            for name in [n for n, r in holders.items() if self._mine(run_id, holder, n, r.run_id)]:
                del holders[name]
                touched.add(key)
        for waiters in self._t.waiters.values():
            for name in [n for n, r in waiters.items() if self._mine(run_id, holder, n, r.run_id)]:
                del waiters[name]
        for rk in [
            k for k, r in self._t.reserved.items() if self._mine(run_id, holder, k[2], r.run_id)
        ]:
            del self._t.reserved[rk]
        wakes: list[rules.Wake] = []
        for key in sorted(touched):
            wakes += self._admissible(key)
        return wakes

    def _admissible(self, key: Key) -> list[rules.Wake]:
        self._purge(key)
        ranked = self._ranked(key)
        if not ranked:
            return []
        free = rules.admissible(len(self._t.holders.get(key, {})), ranked[0][1].maximum)
        return [
            rules.Wake(w.run_id, name, w.wake, rules.wake_key(name, w.arrival))
            for name, w in ranked[:free]
        ]

    async def sweep(self, *, now_ms: int, limit: int = 100) -> list[rules.Wake]:
        for key in list(self._t.holders):
            self._purge(key)
        wakes: list[rules.Wake] = []
        for key in sorted(self._t.waiters):
            wakes += self._admissible(key)
        return wakes[:limit]

    async def waiting(self, run_ids: Sequence[str], *, now_ms: int) -> dict[str, rules.WaitingOn]:
        wanted = set(run_ids)
        out: dict[str, rules.WaitingOn] = {}
        for (scope, key), reserved_at in (
            ((k[0], k[1]), (k[2], r)) for k, r in self._t.reserved.items()
        ):
            name, row = reserved_at
            if row.run_id in wanted and row.at_ms > now_ms:
                out[row.run_id] = rules.WaitingOn(
                    row.run_id, "rate", scope, key, name, until=_ms(row.at_ms)
                )
        for scope, key in self._t.waiters:
            for place, (name, w) in enumerate(self._ranked((scope, key)), start=1):
                if w.run_id in wanted:
                    out[w.run_id] = rules.WaitingOn(
                        w.run_id, "concurrency", scope, key, name, w.priority, place,
                        since=_ms(w.since_ms),
                    )  # fmt: skip
        return out
