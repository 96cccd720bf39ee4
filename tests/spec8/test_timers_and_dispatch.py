"""Spec 8 timer keys and the decision table over a log (seed 003 "Sleeps and timers,
spec 8 against spec 9"; seed 000 "The dispatch decision table")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from treadle.orchestrator.logstate import LogState
from treadle.orchestrator.spec8 import dispatch, ownership, timers
from treadle.world import events

HOUR = 3_600_000
HOP = 23 * HOUR
NEAR = 5_000


def test_the_last_hop_is_keyed_by_the_wait_alone() -> None:
    key, delay = timers.key_and_delay(
        timers.Timer("w1", 10 * 60_000), now_ms=0, max_hop_ms=HOP, near_elapsed_ms=NEAR
    )
    assert (key, delay) == ("w1", 10 * 60_000)


def test_a_long_sleep_goes_in_full_hops_from_the_senders_clock_each_with_its_own_key() -> None:
    """Hops of at most 23 h counted from the sender's clock: the first is a full one, the
    last what is left; a hop's key names the hops still to go, so each is its own."""
    wait = timers.Timer("w1", 7 * 24 * HOUR)
    now, keys = 0, []
    while True:
        key, delay = timers.key_and_delay(wait, now_ms=now, max_hop_ms=HOP, near_elapsed_ms=NEAR)
        keys.append(key)
        if key == "w1":
            assert delay == wait.resume_at_ms - now  # the last hop is what is left
            break
        assert delay == HOP  # every earlier hop is a full one
        now += delay
    assert keys == [f"w1:hop-{n}" for n in range(8, 1, -1)] + ["w1"]
    assert len(set(keys)) == len(keys)


def test_a_near_elapsed_wait_is_rearmed_once_per_second_of_the_senders_clock() -> None:
    wait = timers.Timer("w1", 100_000)
    first, _ = timers.key_and_delay(wait, now_ms=96_100, max_hop_ms=HOP, near_elapsed_ms=NEAR)
    same, _ = timers.key_and_delay(wait, now_ms=96_900, max_hop_ms=HOP, near_elapsed_ms=NEAR)
    later, _ = timers.key_and_delay(wait, now_ms=97_000, max_hop_ms=HOP, near_elapsed_ms=NEAR)
    assert first == same == "w1:96" and later == "w1:97"


def test_an_early_timer_rearms_under_its_attempt_and_message() -> None:
    """A timer delivered before its wait is due re-arms under ``:a<attempt>`` (with the
    early message's id: a re-arm that itself comes early is a new message of attempt 1)."""
    wait = timers.Timer("w1", 100_000)
    key, delay = timers.key_and_delay(
        wait, now_ms=99_000, max_hop_ms=HOP, near_elapsed_ms=NEAR, early=(2, "msg_A")
    )
    assert (key, delay) == ("w1:a2:msg_A", 1_000)
    again, _ = timers.key_and_delay(
        wait, now_ms=99_500, max_hop_ms=HOP, near_elapsed_ms=NEAR, early=(1, "msg_B")
    )
    assert again != key


def test_the_continuation_is_stamped_with_the_runs_version() -> None:
    send = timers.continuation(
        run_id="wrun_x",
        deployment_id="d1",
        spec_version=8,
        wait=timers.Timer("w1", 60_000),
        now_ms=0,
        max_hop_ms=HOP,
        near_elapsed_ms=NEAR,
    )
    assert send.message.run_spec_version == 8
    assert send.message.wait_continuation is not None
    assert send.message.wait_continuation.resume_at_ms is None  # never an intermediate hop
    assert (send.key, send.delay_seconds) == ("w1", 60.0)


T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _log(*items: tuple[events.Event, datetime]) -> tuple[LogState, list[events.LoggedEvent]]:
    created = events.RunCreated(workflow_name="wf", deployment_id="d1", spec_version=8)
    logged = [events.LoggedEvent(run_id="wrun_x", slot=1, created_at=T0, in_band=True,
                                 event=created)]  # fmt: skip
    for slot, (event, at) in enumerate(items, start=2):
        logged.append(
            events.LoggedEvent(
                run_id="wrun_x", slot=slot, created_at=at, in_band=False, event=event
            )
        )
    state = LogState("wrun_x")
    for record in logged:
        state.apply(record)
    return state, logged


def _inline_start(cid: str, owner: str | None, attempt: int = 1) -> events.StepStarted:
    return events.StepStarted(
        correlation_id=cid, step_name="s", attempt=attempt, inline=True, owner_message_id=owner,
        position=0 if attempt == 1 else None,
    )  # fmt: skip


def test_the_table_executes_its_own_defers_to_another_and_enqueues_the_rest() -> None:
    """Owned by me: execute; owned by another within the lease: the epoch's backstop;
    a background step (never owned): the immediate keyed enqueue."""
    state, logged = _log(
        (_inline_start("mine", "msg_me"), T0),
        (_inline_start("theirs", "msg_other"), T0 + timedelta(seconds=10)),
        (events.StepCreated(correlation_id="eager", step_name="s", position=2), T0),
    )
    table = dispatch.Table(my_message_id="msg_me", lease_seconds=860)
    now = T0 + timedelta(seconds=60)
    planned = table.plan(state, logged, running=set(), absorbed=set(), now=now)
    plan = {p.step.step_id: p for p in planned}
    assert plan["mine"].action is ownership.Action.EXECUTE
    theirs = plan["theirs"]
    assert theirs.action is ownership.Action.BACKSTOP
    assert theirs.delay_seconds == 860 - 50
    assert theirs.key == ownership.backstop_key("theirs", T0 + timedelta(seconds=10))
    assert plan["eager"].action is ownership.Action.ENQUEUE


def test_a_step_lost_to_the_single_flight_is_never_executed_again_by_that_delivery() -> None:
    state, logged = _log((_inline_start("mine", "msg_me"), T0))
    table = dispatch.Table(my_message_id="msg_me", lease_seconds=860)
    (planned,) = table.plan(
        state, logged, running=set(), absorbed={"mine"}, now=T0 + timedelta(seconds=1)
    )
    assert planned.action is ownership.Action.BACKSTOP
    assert table.owned_open(state, logged, absorbed={"mine"}) == []
    assert table.owned_open(state, logged, absorbed=set()) == ["mine"]


def test_the_kill_switch_enqueues_an_owned_step_and_a_running_one_is_left_alone() -> None:
    state, logged = _log(
        (_inline_start("theirs", "msg_other"), T0), (_inline_start("busy", "msg_me"), T0)
    )
    off = dispatch.Table(my_message_id="msg_me", lease_seconds=860, enabled=False)
    plan = off.plan(state, logged, running={"busy"}, absorbed=set(), now=T0 + timedelta(seconds=1))
    assert [(p.step.step_id, p.action) for p in plan] == [("theirs", ownership.Action.ENQUEUE)]


def test_a_max_retries_0_owned_step_found_started_is_failed_as_exhausted_not_rerun() -> None:
    state, _ = _log((_inline_start("once", "msg_me"), T0))
    failed = dispatch.exhausted(state.steps["once"], 0, "msg_me")
    assert (failed.attempt, failed.error.type) == (1, "StepAttemptsExhausted")
