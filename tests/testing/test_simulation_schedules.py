"""The simulation generates schedules (``gen_schedules``) and its invariants
(``invariants_schedules``) catch what a broken firing rule would do: seeds with
schedules hold every invariant, and each rule, broken on purpose, fails on a seed.

- Seed 16 (its CI plan, every generator): a firing's run was created, its start
  message's send failed (queue_error), and the run stayed pending for good, its
  schedule's next firings held behind it (``schedule_not_quiet``); fixed in
  ``schedules.firing``: ``settle`` sends a pending last run's start again, and a claim
  that replaces a pending last run sends its start too.
- Seed 289 (the soak's plan, spec mixed, every generator): the last firing's scheduler
  was killed right after its claim, after the final pause; the next pass's ``settle``
  started the claimed run, but the World was judged quiet before it (its runs ended,
  the schedule paused), so the run read as claimed and never started. The model's
  ``quiet`` now also waits for the last claimed firing's run to exist.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest

from treadle.schedules import firing
from treadle.schedules import loop as firing_loop
from treadle.testing.simulation import (
    Config,
    FaultPlan,
    gen_schedules,
    invariants_schedules,
    simulate,
)

# Only the schedules generator: programs as the pinned seeds drew them, plus schedules.
SCHED = Config(spec="9", generators=("schedules",))
# Every generator as seed 16 was found with (before stream_fences).
FOUND_WITH = ("attributes", "children", "timeouts", "streams", "hook_claims", "limits")
FOUND_WITH += ("schedules",)
SEED_16 = Config(
    spec="9",
    optimistic="default",
    generators=FOUND_WITH,
    plan=FaultPlan.parse(
        "crash=0.004,fail_after=0.02,kill=0.004,lapse=0.003,pause=0.004,queue_error=0.01,"
        "stall=0.006,budget=8"
    ),
)


def _kinds(seed: int, config: Config = SCHED) -> set[str]:
    return {v.kind for v in simulate(seed, config).violations}


@pytest.mark.parametrize("seed", [s for s in range(40) if gen_schedules.draw(s) is not None][:12])
def test_seeds_with_schedules_hold_every_invariant(seed: int) -> None:
    report = simulate(seed, SCHED)
    assert report.ok, [str(v) for v in report.violations]
    assert report.schedules["runs"] > 0  # the firing loop fired


def test_the_firing_loop_is_off_without_schedules() -> None:
    """A seed with no schedule drawn runs no firing loop (its replay is as pinned)."""
    seed = next(s for s in range(40) if gen_schedules.draw(s) is None)
    report = simulate(seed, SCHED)
    assert report.ok and not report.schedules


async def _act_before_seed_16(world: Any, start: firing.Starter, claimed: firing.Claimed) -> None:
    """``firing.act`` as it was: no start for a pending run the claim replaces."""
    state = claimed.record.state
    if claimed.decision not in ("start", "cancel_and_start"):
        return
    assert state.last_run_id is not None and state.last_fired_at is not None
    if claimed.decision == "cancel_and_start":
        await firing.cancel(world, state.previous_run_id, claimed.record.name)
    await start(claimed.record.spec, state.last_run_id, state.last_fired_at)


def test_a_claimed_run_whose_start_was_never_sent_is_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    report = simulate(16, SEED_16)
    assert report.ok, [str(v) for v in report.violations]
    monkeypatch.setattr(firing, "RESTART_PENDING_AFTER", timedelta(days=3650))
    monkeypatch.setattr(firing, "act", _act_before_seed_16)
    assert "schedule_not_quiet" in _kinds(16, SEED_16)


def test_a_start_under_skip_while_the_last_run_runs_is_an_overlap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seed 2 (one skip schedule, firings skipped): a ``decide`` that starts whatever
    the last run does is reported as ``schedule_overlap``."""
    assert simulate(2, SCHED).schedules["skipped"] > 0
    monkeypatch.setattr(firing, "decide", lambda overlap, previous, buffered: "start")
    assert "schedule_overlap" in _kinds(2)


def test_a_claim_whose_scheduler_died_must_be_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 12: processes die right after claims (``schedules.claimed``); a ``settle``
    that does not start a claimed run that does not exist leaves it unstarted."""
    assert simulate(12, SCHED).schedules["killed_after_claim"] > 0
    real = firing.settle

    async def no_repair(world: Any, start: firing.Starter, record: Any) -> Any:
        previous = await firing.previous_run(world, record.state)
        return "ended" if previous == "missing" else await real(world, start, record)

    monkeypatch.setattr(firing, "settle", no_repair)
    assert "schedule_claim_unstarted" in _kinds(12)


def test_missed_firings_are_counted_as_they_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 12 misses a firing (a 2 s catch-up window): a ``skip_missed`` that counts
    one firing fewer than it passes is reported as ``schedule_accounting``."""
    assert simulate(12, SCHED).schedules["missed"] > 0
    real = firing_loop.skip_missed

    def one_fewer(c: Any, t: Any, cutoff: Any) -> Any:
        count, due = real(c, t, cutoff)
        return max(count - 1, 0), due

    monkeypatch.setattr(firing_loop, "skip_missed", one_fewer)
    assert "schedule_accounting" in _kinds(12)


def test_a_resume_keeps_the_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pause or resume that resets ``skipped`` is reported as ``schedule_accounting``
    (seed 2 pauses its skip schedule at its end, after firings were skipped)."""
    from treadle.testing.memory import schedules as memory_schedules

    real = memory_schedules.MemorySchedules.update

    async def resetting(self: Any, name: str, *, expected_version: int, state: Any) -> Any:
        held = self._backend.schedules.get(name)
        if held is not None and held.state.paused != state.paused:
            state = dataclasses.replace(state, skipped=0)
        return await real(self, name, expected_version=expected_version, state=state)

    monkeypatch.setattr(memory_schedules.MemorySchedules, "update", resetting)
    assert "schedule_accounting" in _kinds(2)


SEED_289 = Config(
    spec="mixed",
    optimistic="on",
    plan=FaultPlan.parse(
        "crash=0.001,feed_drop=0.005,fence=0.012,kill=0.004,kill_owner=0.005,lapse=0.012,"
        "lost_wake=0.002,pause=0.004,stall=0.006,budget=12"
    ),
)


def test_a_claim_killed_after_the_final_pause_is_started_before_the_world_is_quiet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seed 289: the claimed run is started by the next pass (5 runs, none unstarted);
    with ``quiet`` blind to the unstarted claim, the check ran before that pass."""
    report = simulate(289, SEED_289)
    assert report.ok, [str(v) for v in report.violations]
    assert report.schedules["killed_after_claim"] > 0

    def quiet_before_the_fix(backend: Any, plan: Any) -> bool:
        for s in plan.schedules:
            record = backend.schedules.get(s.name)
            if record is None or not record.state.paused or record.state.buffered_at:
                return False
        runs = invariants_schedules.runs_of(backend)
        return all(backend.run_record(r).is_terminal for r in runs)

    monkeypatch.setattr(gen_schedules, "quiet", quiet_before_the_fix)
    assert "schedule_claim_unstarted" in _kinds(289, SEED_289)
