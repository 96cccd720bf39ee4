"""One firing of a schedule: the overlap decision, the claim, then the run.

The rules are the World-independent half of schedules (``Schedules`` stores and
compares; this decides), anchored on Temporal Schedules:

- A firing at time ``t`` is one run with the id ``run_id_for(name, t)`` (a keyed run
  id of the name and the time), so starting it twice records it once.
- The overlap policy reads the status of the schedule's last run (``last_run_id``):
  ``allow`` starts anyway; ``skip`` drops the firing (counted in ``skipped``);
  ``buffer_one`` holds one firing (``buffered_at``) until that run ends, dropping
  any further one; ``cancel_other`` cancels that run, then starts.
- The claim comes first: ``Schedules.update`` (compare-and-set on the version) writes
  the new state, naming the new run as ``last_run_id``, before the run is started.
  Of two schedulers that read one version one claims and starts; the other's update
  is refused and it reads again (the firing is handled). A scheduler that dies after
  its claim leaves a ``last_run_id`` that names no run: whoever reads the schedule
  next (``settle``) starts it (and, under ``cancel_other``, cancels
  ``previous_run_id``), so the firing happens exactly once. A run created whose start
  message never went out (the send failed, or its scheduler died after the create)
  stays pending: ``settle`` sends its start again once it is ``RESTART_PENDING_AFTER``
  old.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import JsonValue

from treadle import clock, errors
from treadle.world import contract, events, ids, records

log = logging.getLogger("treadle.schedules")

PreviousRun = Literal["none", "running", "ended", "missing", "unstarted"]
Decision = Literal["start", "cancel_and_start", "buffer", "skip"]
# Starts the run of a firing: (spec, run id, firing time) -> None; safe to repeat.
Starter = Callable[[records.ScheduleSpec, str, datetime], Awaitable[None]]
# A claimed run still pending this long after its creation is started again: its start
# message may never have gone out (the send failed after the create, or the scheduler
# died between them; sim seed 16). A second start of an existing run is only a wake.
RESTART_PENDING_AFTER = timedelta(seconds=5)


def run_id_for(name: str, fire_at: datetime) -> str:
    """The run a firing of ``name`` at ``fire_at`` is: the same id from any scheduler."""
    at = fire_at.astimezone(UTC).isoformat(timespec="milliseconds")
    return ids.keyed_run_id(f"treadle.schedule\0{name}\0{at}")


def attributes_for(name: str, fire_at: datetime) -> dict[str, JsonValue]:
    """The attributes every run of a schedule carries (Temporal's ScheduledById and
    ScheduledStartTime): which schedule fired it, and for which time."""
    return {
        "treadle.schedule": name,
        "treadle.scheduled_at": fire_at.astimezone(UTC).isoformat(timespec="milliseconds"),
    }


async def previous_run(world: contract.World, state: records.ScheduleState) -> PreviousRun:
    if state.last_run_id is None:
        return "none"
    try:
        run = await world.runs.get(state.last_run_id)
    except errors.RunNotFound:
        return "missing"
    if run.status == "pending" and clock.utcnow() - run.created_at >= RESTART_PENDING_AFTER:
        return "unstarted"
    return "ended" if run.is_terminal else "running"


def decide(overlap: records.ScheduleOverlap, previous: PreviousRun, buffered: bool) -> Decision:
    if previous in ("none", "ended") or overlap == "allow":
        return "start"
    if overlap == "cancel_other":
        return "cancel_and_start"
    if overlap == "buffer_one" and not buffered:
        return "buffer"
    return "skip"


def claimed_state(
    state: records.ScheduleState, name: str, fire_at: datetime, decision: Decision
) -> records.ScheduleState:
    """The state after a firing at ``fire_at`` decided ``decision`` (next_fire_at is the
    caller's to move)."""
    if decision == "skip":
        return dataclasses.replace(state, skipped=state.skipped + 1)
    if decision == "buffer":
        return dataclasses.replace(state, buffered_at=fire_at)
    return dataclasses.replace(
        state,
        last_fired_at=fire_at,
        last_run_id=run_id_for(name, fire_at),
        previous_run_id=state.last_run_id,
    )


@dataclass(frozen=True, slots=True)
class Claimed:
    record: records.ScheduleRecord
    decision: Decision


async def cancel(world: contract.World, run_id: str | None, name: str) -> None:
    """Cancel the schedule's previous run (``cancel_other``); an ended one is left."""
    if run_id is None:
        return
    reason = f"cancelled by schedule {name} (overlap cancel_other)"
    try:
        await world.events.create(run_id, events.RunCancelled(reason=reason), in_band=False)
        log.info("run %s: cancelled by schedule %s (cancel_other)", run_id, name)
    except (errors.RunExpired, errors.RunNotFound):
        pass


async def act(world: contract.World, start: Starter, claimed: Claimed) -> None:
    """What a won claim owes: cancel the previous run (cancel_other), start the new one."""
    record, state = claimed.record, claimed.record.state
    if claimed.decision not in ("start", "cancel_and_start"):
        return
    assert state.last_run_id is not None
    assert state.last_fired_at is not None
    if claimed.decision == "cancel_and_start":
        await cancel(world, state.previous_run_id, record.name)
    elif state.previous_run_id is not None and state.previous_run_id != state.last_run_id:
        # The run this claim replaces as the last one may be pending for good (its start
        # message never went out); no later ``settle`` looks at it: send its start again
        # (an existing run's start is only a wake; ``fire_at`` names no new run here).
        with contextlib.suppress(errors.RunNotFound):
            if (await world.runs.get(state.previous_run_id)).status == "pending":
                await start(record.spec, state.previous_run_id, state.last_fired_at)
    await start(record.spec, state.last_run_id, state.last_fired_at)
    log.info(
        "run %s: fired by schedule %s for %s", state.last_run_id, record.name,
        state.last_fired_at.isoformat(),
    )  # fmt: skip


async def settle(
    world: contract.World, start: Starter, record: records.ScheduleRecord
) -> PreviousRun:
    """The status of the schedule's last run, first starting it when a claim named it and
    its scheduler died before the start (the run does not exist)."""
    previous = await previous_run(world, record.state)
    state = record.state
    if previous == "unstarted":
        assert state.last_run_id is not None
        assert state.last_fired_at is not None
        log.warning(
            "run %s: schedule %s started it but it is still pending; sending its start again",
            state.last_run_id, record.name,
        )  # fmt: skip
        await start(record.spec, state.last_run_id, state.last_fired_at)
        return "running"
    if previous != "missing":
        return previous
    assert state.last_run_id is not None
    assert state.last_fired_at is not None
    log.warning(
        "run %s: schedule %s claimed it but it was never started; starting it now",
        state.last_run_id, record.name,
    )  # fmt: skip
    if record.spec.overlap == "cancel_other":
        await cancel(world, state.previous_run_id, record.name)
    await start(record.spec, state.last_run_id, state.last_fired_at)
    return "running"


async def claim(
    schedules: contract.Schedules,
    record: records.ScheduleRecord,
    state: records.ScheduleState,
    decision: Decision,
) -> Claimed | None:
    """Write ``state`` if nobody wrote since ``record`` was read; None if somebody did."""
    won = await schedules.update(record.name, expected_version=record.version, state=state)
    return None if won is None else Claimed(won, decision)


async def fire_now(
    world: contract.World,
    schedules: contract.Schedules,
    start: Starter,
    name: str,
    fire_at: datetime,
    *,
    overlap: records.ScheduleOverlap | None = None,
    attempts: int = 20,
) -> Decision:
    """One firing at ``fire_at`` outside the cron's own (trigger, backfill): next_fire_at
    is left alone. ``overlap`` overrides the schedule's policy for this firing."""
    for _ in range(attempts):
        record = await schedules.get(name)
        previous = await settle(world, start, record)
        state = record.state
        if state.last_run_id == run_id_for(name, fire_at):
            return "start"  # this firing was claimed already (a retried call)
        decision = decide(overlap or record.spec.overlap, previous, state.buffered_at is not None)
        claimed = await claim(
            schedules, record, claimed_state(state, name, fire_at, decision), decision
        )
        if claimed is not None:
            await act(world, start, claimed)
            return decision
    raise errors.StorageUnavailable(
        f"schedule {name}: the firing at {fire_at.isoformat()} lost {attempts} claims in a row"
    )
