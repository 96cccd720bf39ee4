"""The optional World-wide stores of the World contract: ``Schedules``
(``world.schedules``), ``LimitStore`` (``world.limits``) and ``Heartbeats``
(``world.heartbeats``, found by ``heartbeats_of``). A World that lacks one refuses
the feature (or, for heartbeats, judges a lapse in the step's own process only).

Part of ``treadle.world.contract``, which re-exports every name here (callers use
``contract.Schedules``); the rules are the features' own (``treadle.schedules``,
``treadle.world.limitrules``, ``orchestrator.steptimeouts``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from pydantic import JsonValue

from treadle.world import limitrules, records

# -- schedules (issue 17 item 3: treadle.schedules) ----------------------------------------


@runtime_checkable
class Schedules(Protocol):
    """A World's schedules table (``world.schedules``): specs and their firing state.

    The World stores and compares; every rule of when and what to fire is
    ``treadle.schedules``' (shared by every World). ``version`` moves on every write,
    so ``update`` is a compare-and-set: two schedulers (two workers, two pods) that
    read one version race, one wins, the other gets None and reads again. That claim,
    with a run id derived from the schedule's name and the firing time, makes a firing
    happen once.
    """

    async def put(
        self, spec: records.ScheduleSpec, *, next_fire_at: datetime | None
    ) -> records.ScheduleRecord:
        """Create the schedule, or replace the spec of the one of that name (its state is
        kept but ``paused`` and ``next_fire_at``, set from here); the version moves."""
        ...

    async def put_if(
        self, spec: records.ScheduleSpec, *, next_fire_at: datetime | None, expected_version: int
    ) -> records.ScheduleRecord | None:
        """``put`` as a compare-and-set, as ``update``: written only when the stored version
        is ``expected_version`` (``0``: only when there is no such schedule), else None and
        nothing written; so a put computed from a read cannot write back a
        ``next_fire_at`` that a claim moved meanwhile (``treadle.schedules.api.store``)."""
        ...

    async def get(self, name: str) -> records.ScheduleRecord:
        """``ScheduleNotFound`` when no schedule has that name."""
        ...

    async def list(self, *, limit: int = 1000) -> list[records.ScheduleRecord]:
        """Every schedule by name, up to ``limit``."""
        ...

    async def update(
        self, name: str, *, expected_version: int, state: records.ScheduleState
    ) -> records.ScheduleRecord | None:
        """Replace the state when the stored version is ``expected_version``; the new
        record, or None (nothing written) when it moved or the schedule is gone."""
        ...

    async def delete(self, name: str) -> bool:
        """Remove the schedule (its runs stay); False when there was none."""


# -- concurrency and rate limits (issue 17 item 4; rules in ``treadle.world.limitrules``) ---


@runtime_checkable
class LimitStore(Protocol):
    """Slots, waiters and token buckets per (scope, key), shared by every worker of a World
    (``world.limits``; a World without it refuses limited workflows and steps).

    Every operation is one transaction per key (Postgres: a row lock on the key; the
    local World: SQLite's single writer; memory: one step of the loop)."""

    async def acquire(self, claim: limitrules.Claim, *, now_ms: int) -> limitrules.Admission:
        """Hold a slot, or be recorded (or stay) waiting; idempotent per holder."""
        ...

    async def reserve(self, claim: limitrules.RateClaim, *, now_ms: int) -> int:
        """The time (ms) this holder may start; a holder's reservation is kept."""
        ...

    async def release(self, run_id: str, *, holder: str | None = None) -> list[limitrules.Wake]:
        """Drop ``holder``'s slot, waiting place and reservation (None: everything the run
        holds or waits on, its steps' included); the waiters now admissible."""
        ...

    async def sweep(self, *, now_ms: int, limit: int = 100) -> list[limitrules.Wake]:
        """Drop dead holders and waiters everywhere; the waiters now admissible."""
        ...

    async def waiting(
        self, run_ids: Sequence[str], *, now_ms: int
    ) -> dict[str, limitrules.WaitingOn]:
        """What each of these runs (or one of its steps) waits on, if anything."""
        ...


# -- step heartbeats (issue 17 item 5, docs/timeouts.md) --------------------------------


@runtime_checkable
class Heartbeats(Protocol):
    """Where a step's heartbeats are kept: one row per step, never the log.

    An optional member, ``world.heartbeats`` (``heartbeats_of``). ``record`` keeps the
    latest beat of a step: a beat of an attempt older than the one stored is ignored
    (a stalled process's late beat never hides the new attempt's). Rows go with their
    run's storage; they are small (details within ``treadle.limits``) and written at
    most once per throttle interval per attempt (``orchestrator.steptimeouts``).
    """

    async def record(
        self, run_id: str, step_id: str, *, attempt: int, details: JsonValue, beat_at: datetime
    ) -> None: ...

    async def get(self, run_id: str, step_id: str) -> records.HeartbeatRecord | None: ...


def heartbeats_of(world: object) -> Heartbeats | None:
    """The World's heartbeat store, or None when it keeps none (then a heartbeat lapse is
    judged in the step's own process only, and a next attempt sees no details)."""
    store = getattr(world, "heartbeats", None)
    return store if isinstance(store, Heartbeats) else None
