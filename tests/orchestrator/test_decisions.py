"""The orchestrator's pure rules: timer keys and hops, the re-send rule, batches, due waits."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from treadle.orchestrator import decisions, timers
from treadle.orchestrator.logstate import LogState
from treadle.replay import operations
from treadle.world import events

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
HOUR_MS = 3_600_000
HOP_MS = 23 * HOUR_MS


def _logged(slot: int, event: events.Event, at: datetime = NOW) -> events.LoggedEvent:
    return events.LoggedEvent(run_id="wrun_x", slot=slot, created_at=at, in_band=True, event=event)


def _state(*evs: tuple[events.Event, datetime]) -> LogState:
    state = LogState("wrun_x")
    for slot, (event, at) in enumerate(evs, start=1):
        state.apply(_logged(slot, event, at))
    return state


def test_timer_keys_name_the_wait_and_the_hop() -> None:
    """Seed 003 "Timer keys": hop, early re-arm and near-due forms."""
    assert timers.hop_key("wait_a", 1000, 900) == "wait:wait_a:1000:900"
    assert timers.rearm_key("wait_a", 1000, 1000, 3, "msg_x") == "wait:wait_a:1000:1000:mmsg_x:a3"
    assert timers.near_due_key("wait_a", 1000, 12_345) == "wait:wait_a:1000:s12"


def test_only_a_near_due_key_is_taken_for_one() -> None:
    """``is_near_due_key`` (the once-per-process rule of near-due sends keys on it): not a
    hop, not a re-arm, and not a step message's key, whose last part starts with "s" too
    (``step:<run>:step_...``: the simulation's near_due_resent check once took those)."""
    assert timers.is_near_due_key(timers.near_due_key("wait_a", 1000, 12_345))
    assert not timers.is_near_due_key(timers.hop_key("wait_a", 1000, 900))
    assert not timers.is_near_due_key(timers.rearm_key("wait_a", 1000, 1000, 3, "msg_s"))
    assert not timers.is_near_due_key("step:wrun_1:step_661e220aae35f65238b9")
    assert not timers.is_near_due_key("wait:wait_a:1000:sx")
    assert not timers.is_near_due_key(None)


def test_a_three_day_sleep_is_reached_in_hops_anchored_on_its_deadline() -> None:
    """The first hop takes the remainder; later ones are whole hops; the last is the deadline."""
    now, resume = 0, 3 * 24 * HOUR_MS
    hops = []
    while True:
        hop = timers.next_hop(resume, now, HOP_MS)
        hops.append((hop.hop_at_ms - now) // 1000)
        if hop.final:
            break
        now = hop.hop_at_ms
    assert hops == [10_800, 82_800, 82_800, 82_800]


def test_every_sender_names_the_same_hop_whatever_its_clock() -> None:
    """Hops anchored on the deadline: two senders a minute apart send one keyed message."""
    resume = 3 * 24 * HOUR_MS
    first = timers.next_hop(resume, 0, HOP_MS)
    later = timers.next_hop(resume, 60_000, HOP_MS)
    assert first == later
    assert not first.final


def test_an_intermediate_hop_carries_the_deadline_and_the_last_does_not() -> None:
    """Only an intermediate hop has wait_continuation.resume_at_ms (it is never gated)."""
    long = timers.timer_send(
        run_id="wrun_x", deployment_id="d", spec_version=9, correlation_id="wait_a",
        resume_at_ms=3 * HOP_MS, now_ms=0, max_hop_ms=HOP_MS,
    )  # fmt: skip
    short = timers.timer_send(
        run_id="wrun_x", deployment_id="d", spec_version=9, correlation_id="wait_a",
        resume_at_ms=1000, now_ms=0, max_hop_ms=HOP_MS,
    )  # fmt: skip
    assert long.message.is_intermediate_hop
    assert long.delay_seconds == HOP_MS / 1000
    assert not short.message.is_intermediate_hop
    assert short.key == "wait:wait_a:1000:1000"
    assert short.delay_seconds == 1.0


def test_the_resend_rule_takes_unstarted_background_steps_younger_than_23_hours() -> None:
    """Re-send rule and B6: created, not started, < 23 h old; started or older ones stay."""
    fresh = events.StepCreated(correlation_id="s1", step_name="a", creator_message_id="m")
    old = events.StepCreated(correlation_id="s2", step_name="a", creator_message_id="m")
    started = events.StepCreated(correlation_id="s3", step_name="a", creator_message_id="m")
    state = _state(
        (fresh, NOW - timedelta(hours=1)),
        (old, NOW - timedelta(hours=23, minutes=1)),
        (started, NOW - timedelta(hours=1)),
        (events.StepStarted(correlation_id="s3", step_name="a", attempt=1), NOW),
    )
    chosen = decisions.steps_to_resend(state, now=NOW, recovery=False)
    assert [r.step.step_id for r in chosen] == ["s1"]
    recovery = decisions.steps_to_resend(state, now=NOW, recovery=True)
    assert sorted(r.step.step_id for r in recovery) == ["s1", "s2", "s3"]
    assert {r.step.step_id: r.attempt for r in recovery}["s3"] == 2


def test_the_resend_rule_takes_an_inline_retry_the_orchestrator_moved() -> None:
    """An inline step whose last event is a creator-stamped step_retrying, < 23 h old."""
    error = events.ErrorInfo(message="busy")
    state = _state(
        (events.StepStarted(correlation_id="s1", step_name="a", attempt=1, inline=True), NOW),
        (events.StepRetrying(correlation_id="s1", step_name="a", attempt=1, error=error,
                             retry_after=NOW + timedelta(seconds=30),
                             creator_message_id="m"), NOW),
        (events.StepStarted(correlation_id="s2", step_name="a", attempt=1, inline=True), NOW),
        (events.StepRetrying(correlation_id="s2", step_name="a", attempt=1, error=error), NOW),
    )  # fmt: skip
    chosen = decisions.steps_to_resend(state, now=NOW, recovery=False)
    assert [(r.step.step_id, r.attempt, r.delay_seconds) for r in chosen] == [("s1", 2, 30.0)]
    too_late = decisions.steps_to_resend(state, now=NOW + timedelta(hours=24), recovery=False)
    assert too_late == []


def test_due_and_near_due_waits() -> None:
    """Due by the clock or named by a wake-up, earliest first; near-due within the window."""
    state = _state(
        (events.WaitCreated(correlation_id="w1", resume_at=NOW + timedelta(seconds=3)), NOW),
        (events.WaitCreated(correlation_id="w2", resume_at=NOW - timedelta(seconds=1)), NOW),
        (events.WaitCreated(correlation_id="w3", resume_at=NOW + timedelta(hours=1)), NOW),
    )
    now_ms = int(NOW.timestamp() * 1000)
    assert [w.wait_id for w in decisions.due_waits(state, now_ms=now_ms, woken=set())] == ["w2"]
    woken = decisions.due_waits(state, now_ms=now_ms, woken={"w3"})
    assert [w.wait_id for w in woken] == ["w2", "w3"]
    near = decisions.near_due_waits(state, now_ms=now_ms, window_ms=5000)
    assert [w.wait_id for w in near] == ["w1"]


def test_creation_batches_hold_64_events_or_512_kib() -> None:
    """Seed 003 "Serialization and batches": 64 events or 512 KiB, a big one alone."""
    small = [events.WaitCreated(correlation_id=f"w{i}", resume_at=NOW) for i in range(100)]
    assert [len(b) for b in decisions.creation_batches(list(small))] == [64, 36]
    big = [events.StepCreated(correlation_id=f"s{i}", step_name="a", input="x" * 200_000)
           for i in range(3)]  # fmt: skip
    assert [len(b) for b in decisions.creation_batches(list(big))] == [2, 1]
    huge = [events.StepCreated(correlation_id="h", step_name="a", input="x" * 600_000)]
    assert [len(b) for b in decisions.creation_batches(list(huge) + small[:2])] == [1, 2]


async def test_unserializable_arguments_create_a_placeholder_and_its_failure() -> None:
    """E7: a step whose arguments cannot be stored is created failed, in one entity order."""
    future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    call = operations.StepCall(0, "step_x", step_name="a", input_error="no", future=future)
    created, failed = decisions.step_creation(call, inline=True, creator_message_id="m")
    assert created.type == "step_created" and failed.type == "step_failed"
    assert created.correlation_id == failed.correlation_id == "step_x"
