"""Seed 000's unit tests: the ownership state machine, lease math, the backstop key's epochs.

Seed 000 "How the design is protected by tests", Unit: "the ownership state
machine (stamp -> wake sees owner -> retrying clears -> bare start clears ->
re-stamp restores), lease math including the clock-skew clamp, and the
backstop key's epoch behavior, including a regression test walking the full
owner-recovery re-arm sequence against a dedupe model".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from treadle.orchestrator.spec8 import ownership
from treadle.orchestrator.spec8.ownership import Action, Phase
from treadle.world import constants, events

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
CID = "step_01"
LEASE = 860.0


def logged(slot: int, event: events.Event, at: datetime) -> events.LoggedEvent:
    return events.LoggedEvent(run_id="wrun_x", slot=slot, created_at=at, in_band=True, event=event)


def start(owner: str | None, attempt: int = 1) -> events.StepStarted:
    return events.StepStarted(
        correlation_id=CID, step_name="charge", attempt=attempt, inline=True, owner_message_id=owner
    )


def retrying(attempt: int = 1) -> events.StepRetrying:
    return events.StepRetrying(
        correlation_id=CID,
        step_name="charge",
        attempt=attempt,
        error=events.ErrorInfo(message="boom"),
    )


def decide(state: ownership.Ownership, me: str | None, now: datetime) -> ownership.Dispatch | None:
    return ownership.dispatch(
        state, correlation_id=CID, my_message_id=me, now=now, lease_seconds=LEASE
    )


def test_state_machine_stamp_retry_bare_start_and_restamp() -> None:
    state = ownership.UNCREATED
    assert decide(state, "m1", T0) is None  # uncreated: the lazy inline path decides

    state = ownership.apply(state, start("m1"), T0)  # the lazy stamped start creates it
    assert (state.phase, state.owner_message_id, state.last_started_at) == (Phase.OWNED, "m1", T0)
    wake = decide(state, "hook-wake", T0 + timedelta(seconds=5))
    assert wake is not None and wake.action is Action.BACKSTOP  # the wake sees the owner

    owner = decide(state, "m1", T0 + timedelta(seconds=5))
    assert owner is not None and owner.action is Action.EXECUTE  # its redelivery recovers

    bare = ownership.apply(state, start(None, attempt=1), T0 + timedelta(seconds=6))
    assert bare.phase is Phase.UNOWNED and bare.owner_message_id is None  # a bare start clears
    cleared = decide(bare, "hook-wake", T0 + timedelta(seconds=7))
    assert cleared == ownership.Dispatch(Action.ENQUEUE, idempotency_key=CID)

    restamped = ownership.apply(bare, start("m1"), T0 + timedelta(seconds=8))
    # A re-stamp restores the owner.
    assert restamped.phase is Phase.OWNED and restamped.owner_message_id == "m1"

    lapsed = ownership.apply(restamped, retrying(), T0 + timedelta(seconds=9))
    assert lapsed.phase is Phase.UNOWNED and lapsed.lapsed
    again = ownership.apply(lapsed, start("m2", attempt=2), T0 + timedelta(seconds=10))
    assert again.phase is Phase.UNOWNED, "step_retrying ends ownership for good"
    assert decide(again, "m2", T0 + timedelta(seconds=11)) == ownership.Dispatch(
        Action.ENQUEUE, idempotency_key=CID
    )

    done = ownership.apply(
        again,
        events.StepCompleted(correlation_id=CID, step_name="charge", result=1),
        T0 + timedelta(seconds=12),
    )
    assert done.phase is Phase.TERMINAL and decide(done, "m2", T0) is None


def test_fold_reads_only_the_steps_own_events_in_slot_order() -> None:
    other = events.StepStarted(
        correlation_id="step_02", step_name="other", attempt=1, inline=True, owner_message_id="mX"
    )
    log = [logged(2, start("m1"), T0), logged(3, other, T0 + timedelta(seconds=1))]
    state = ownership.fold_ownership(log, CID)
    assert state.owner_message_id == "m1" and state.last_started_at == T0


def test_eager_step_created_by_step_created_is_never_owned() -> None:
    created = events.StepCreated(correlation_id=CID, step_name="charge", input=None)
    state = ownership.apply(ownership.UNCREATED, created, T0)
    state = ownership.apply(state, start(None), T0 + timedelta(seconds=1))
    assert decide(state, "m1", T0 + timedelta(seconds=2)) == ownership.Dispatch(
        Action.ENQUEUE, idempotency_key=CID
    )


def test_lease_remaining_counts_down_from_the_latest_start() -> None:
    assert ownership.lease_remaining(LEASE, T0, T0) == LEASE
    assert ownership.lease_remaining(LEASE, T0, T0 + timedelta(seconds=60)) == LEASE - 60
    assert ownership.lease_remaining(LEASE, T0, T0 + timedelta(seconds=LEASE)) == 0
    assert ownership.lease_remaining(LEASE, T0, T0 + timedelta(seconds=LEASE + 5)) == 0


def test_lease_remaining_is_clamped_when_the_local_clock_runs_behind_the_server() -> None:
    # The start was stamped by the World's clock 120 s ahead of this delivery's clock.
    behind = T0 - timedelta(seconds=120)
    assert ownership.lease_remaining(LEASE, T0, behind) == LEASE
    assert ownership.lease_remaining(900.0, T0, behind) <= ownership.MAX_LEASE_SECONDS


def test_missing_start_time_means_no_lease_and_the_immediate_enqueue() -> None:
    assert ownership.lease_remaining(LEASE, None, T0) == 0
    state = ownership.Ownership(Phase.OWNED, owner_message_id="m1", last_started_at=None)
    assert decide(state, "hook", T0) == ownership.Dispatch(Action.ENQUEUE, idempotency_key=CID)


def test_expired_lease_falls_back_to_the_immediate_keyed_enqueue() -> None:
    state = ownership.apply(ownership.UNCREATED, start("m1"), T0)
    late = T0 + timedelta(seconds=LEASE + 1)
    assert decide(state, "hook", late) == ownership.Dispatch(Action.ENQUEUE, idempotency_key=CID)
    assert decide(state, "m1", late) == ownership.Dispatch(Action.ENQUEUE, idempotency_key=CID)


def test_kill_switch_reverts_dispatch_but_keeps_the_stamp() -> None:
    state = ownership.apply(ownership.UNCREATED, start("m1"), T0)
    off = ownership.dispatch(
        state,
        correlation_id=CID,
        my_message_id="hook",
        now=T0 + timedelta(seconds=1),
        lease_seconds=LEASE,
        enabled=False,
    )
    assert off == ownership.Dispatch(Action.ENQUEUE, idempotency_key=CID)
    assert state.owner_message_id == "m1"


def test_lease_setting_is_clamped_to_one_to_nine_hundred_seconds() -> None:
    assert ownership.clamp_lease(0) == 1
    assert ownership.clamp_lease(-5) == 1
    assert ownership.clamp_lease(860) == 860
    assert ownership.clamp_lease(5000) == 900


def test_backstop_delay_is_the_lease_remainder_and_its_key_names_the_epoch() -> None:
    state = ownership.apply(ownership.UNCREATED, start("m1"), T0)
    wake = decide(state, "hook", T0 + timedelta(seconds=100))
    assert wake is not None
    assert wake.delay_seconds == LEASE - 100
    assert wake.idempotency_key == f"{CID}:backstop:2026-12-01T12:00:00.000000Z"
    # The backstop is a plain run continuation, never the step's own key: the owner's
    # retry handoff under the correlation id must not be absorbed by it.
    assert wake.idempotency_key != CID


@dataclass
class DedupeQueue:
    """Our queues' key rule: a key dedupes for 24 h after its first send, in flight or not."""

    sent: dict[str, datetime] = field(default_factory=dict)
    delivered: list[tuple[str, datetime]] = field(default_factory=list)

    def send(self, key: str, now: datetime, delay: float) -> bool:
        window = timedelta(milliseconds=constants.QUEUE_MIN_STEP_KEY_DEDUPE_WINDOW_MS)
        first = self.sent.get(key)
        if first is not None and now - first < window:
            return False
        self.sent[key] = now
        self.delivered.append((key, now + timedelta(seconds=delay)))
        return True


def test_owner_recovery_re_arm_sequence_always_leaves_an_escape_hatch() -> None:
    """The full re-arm walk of seed 000's second rejected backstop shape.

    The owner m1 stamps the step; a hook wake arms backstop epoch 1. The owner
    crashes; its redelivery re-stamps (epoch 2). Epoch 1's backstop fires during
    epoch 2 and must be able to arm epoch 2's backstop though its own key is still
    held by the queue. The recovered owner then dies for good: epoch 2's backstop
    fires after the lease and dispatches the step at once.
    """
    queue = DedupeQueue()
    state = ownership.apply(ownership.UNCREATED, start("m1"), T0)

    hook_at = T0 + timedelta(seconds=10)
    first = decide(state, "hook", hook_at)
    assert first is not None and first.action is Action.BACKSTOP
    assert queue.send(first.idempotency_key or "", hook_at, first.delay_seconds)
    # A second wake in the same epoch dedupes to the one pending backstop.
    second = decide(state, "timer", hook_at + timedelta(seconds=1))
    assert second is not None and second.idempotency_key == first.idempotency_key
    assert not queue.send(second.idempotency_key or "", hook_at, second.delay_seconds)

    recovery_at = T0 + timedelta(seconds=300)  # the owner's redelivery after its crash
    assert decide(state, "m1", recovery_at) == ownership.Dispatch(Action.EXECUTE)
    state = ownership.apply(state, start("m1"), recovery_at)  # owned recovery re-stamps

    epoch1_fires = queue.delivered[0][1]
    assert epoch1_fires == hook_at + timedelta(seconds=LEASE - 10)
    rearm = decide(state, "backstop-1", epoch1_fires)
    assert rearm is not None and rearm.action is Action.BACKSTOP
    assert rearm.idempotency_key != first.idempotency_key
    assert queue.send(rearm.idempotency_key or "", epoch1_fires, rearm.delay_seconds), (
        "the re-arm must not dedupe against the in-flight epoch 1 backstop"
    )

    epoch2_fires = queue.delivered[-1][1]
    assert epoch2_fires == recovery_at + timedelta(seconds=LEASE)
    final = decide(state, "backstop-2", epoch2_fires)
    assert final == ownership.Dispatch(Action.ENQUEUE, idempotency_key=CID)
    assert queue.send(CID, epoch2_fires, 0), "the step's own message is sent at last"
    # Bounded: one backstop per ownership epoch.
    assert len([k for k, _ in queue.delivered if ":backstop:" in k]) == 2


def test_a_fixed_backstop_key_would_wedge_the_same_sequence() -> None:
    """The sequence above with seed 000's rejected fixed key loses the escape hatch."""
    queue = DedupeQueue()
    fixed = f"{CID}:backstop"
    assert queue.send(fixed, T0 + timedelta(seconds=10), LEASE - 10)
    fires = T0 + timedelta(seconds=LEASE)
    assert not queue.send(fixed, fires, 300), "the fixed key dedupes the re-arm"


def test_unstable_message_ids_recover_through_the_backstop_never_execute_twice() -> None:
    """A queue that mints fresh ids per delivery: the owner check never matches."""
    state = ownership.apply(ownership.UNCREATED, start("delivery-1"), T0)
    redelivered = decide(state, "delivery-2", T0 + timedelta(seconds=30))
    assert redelivered is not None and redelivered.action is Action.BACKSTOP
    after = decide(state, "delivery-3", T0 + timedelta(seconds=30 + redelivered.delay_seconds))
    assert after == ownership.Dispatch(Action.ENQUEUE, idempotency_key=CID)


def test_the_lease_setting_is_clamped_and_the_kill_switch_reads_zero() -> None:
    from treadle import settings

    assert settings.load({}).WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS == 860
    assert (
        settings.load(
            {"WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS": "5000"}
        ).WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS
        == 900
    )
    assert (
        settings.load(
            {"WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS": "0"}
        ).WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS
        == 1
    )
    assert settings.load({"WORKFLOW_INLINE_OWNERSHIP": "0"}).WORKFLOW_INLINE_OWNERSHIP is False
