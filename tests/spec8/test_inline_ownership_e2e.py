"""Seed 000 end to end: the issue #2780 reproduction both ways, the kill switch, and
in-process single-flight, on spec 8 runs of the local World and of Postgres + NATS.

Seed 000 "How the design is protected by tests": "hook resume mid-inline-step: the
side-effect marker fires exactly once. Verified bidirectional: with
WORKFLOW_INLINE_OWNERSHIP=0 the marker fires twice." The same timeline is run with a
sleep coming due mid-step and a cancel arriving mid-step ("any wake that replayed the
run mid-step (hook_received, an elapsed wait continuation, a cancellation)").

Both directions run with two workers: one serving orchestrator messages (the owner and
the wake's delivery, side by side: spec 8 runs are not serialized) and one serving step
messages, each with its own single-flight, as two processes would be. (In one worker the
kill switch's duplicate is absorbed by the process single-flight, which covers spec 8
step messages too: the last test here.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from treadle import RunCancelledError
from treadle.world import events, messages

from ..engine.conftest import MakeApp
from ..engine.faults import FaultyWorld
from .scenarios import (
    MidStep,
    Wake,
    expected_backstop_key,
    orchestrator_send,
    start_mid_step,
)

LEASE = 60.0


async def _until_backstop_armed(scene: MidStep, owner: str) -> None:
    """Wait until a delivery other than the owner armed the backstop and answered."""

    def armed_by_a_wake() -> bool:
        return any(
            t.by is not None and t.by.meta.message_id != owner and scene.answered(t.by)
            for t in scene.backstops()
        )

    try:
        await scene.faulty.queue.until(armed_by_a_wake)
    except TimeoutError:
        sent = [t.name for t in scene.faulty.trace if t.what == "send"]
        raise AssertionError(f"no wake armed a backstop; sends: {sent}") from None


@pytest.mark.parametrize("wake", ["hook", "sleep"])
async def test_a_wake_mid_inline_step_runs_the_body_once_under_ownership(
    make_app: MakeApp, faulty: FaultyWorld, wake: Wake
) -> None:
    """Seed 000 "The bug being fixed" / "The dispatch decision table" (created, ownership
    active, owner is not this message: ensure a backstop wake). A hook resumed (or a sleep
    come due) while charge's inline body blocks: the wake's delivery replays the run beside
    the owner, does not re-queue charge but arms one delayed backstop keyed
    ``<cid>:backstop:<lastStartedAt>`` (delay at most the lease), and acks. The body's
    marker is recorded exactly once; the run completes with the step's result."""
    scene = await start_mid_step(
        make_app, faulty, wake=wake, lease_seconds=LEASE, steps_elsewhere=True
    )
    first = await scene.first_start()
    owner = first.event.owner_message_id
    assert owner is not None, "the lazy inline step_started records its owner"
    assert scene.deliveries_of(owner), "the owner is the delivery running the body"
    await scene.do_wake()
    if wake == "sleep":
        await scene.until_log("the sleep's wait_completed", _has("wait_completed"))
    else:
        await scene.until_log("hook_received", _has("hook_received"))
    await _until_backstop_armed(scene, owner)
    assert scene.marker == [1], "the wake ran the body again"
    assert first.correlation_id is not None
    assert not scene.step_sends(first.correlation_id), "the wake re-queued the owned step"

    (backstop, *more) = scene.backstops()
    assert backstop.send is not None
    assert backstop.send.key == expected_backstop_key(first)
    assert 0 < backstop.send.delay_seconds <= LEASE
    wake_msg = orchestrator_send(backstop)
    assert wake_msg.wait_continuation is None, "a plain run continuation"
    assert wake_msg.run_spec_version == 8
    assert all(t.send is not None and t.send.key == backstop.send.key for t in more)

    scene.release.set()
    assert await scene.run.result(timeout=20) == "charged o-1"
    assert scene.marker == [1]
    log = await scene.log()
    assert [e.event.attempt for e in log if isinstance(e.event, events.StepStarted)] == [1]
    assert _types(log).count("step_completed") == 1
    assert (await scene.run.get()).spec_version == 8


@pytest.mark.parametrize("wake", ["hook", "sleep"])
async def test_with_ownership_off_a_wake_mid_inline_step_runs_the_body_twice(
    make_app: MakeApp, faulty: FaultyWorld, wake: Wake
) -> None:
    """Seed 000 "How the design is protected by tests" (the other direction) and "The bug
    being fixed": with WORKFLOW_INLINE_OWNERSHIP=0 the wake's replay re-queues the running
    inline step (the immediate step message keyed ``step:<run>:<cid>``), whose consumer
    starts it again (a bare ``step_started``, attempt 2) and runs the body a second time,
    beside the first: the marker is recorded twice. One outcome still wins."""
    scene = await start_mid_step(
        make_app, faulty, wake=wake, ownership_on=False, lease_seconds=LEASE, steps_elsewhere=True
    )
    await scene.do_wake()
    await scene.faulty.queue.until(lambda: len(scene.marker) >= 2)
    assert scene.marker == [1, 2], "the re-queued step ran the body a second time"
    scene.release.set()
    assert await scene.run.result(timeout=20) == "charged o-1"
    assert scene.marker == [1, 2]
    log = await scene.log()
    starts = [e.event for e in log if isinstance(e.event, events.StepStarted)]
    assert [s.attempt for s in starts] == [1, 2]
    assert starts[1].owner_message_id is None, "the step message's start is bare"
    assert _types(log).count("step_completed") == 1
    assert not scene.backstops(), "the kill switch arms no backstop"


@pytest.mark.parametrize("ownership_on", [True, False], ids=["ownership", "kill-switch"])
async def test_a_cancel_mid_inline_step_never_runs_the_body_again(
    make_app: MakeApp, faulty: FaultyWorld, ownership_on: bool
) -> None:
    """Seed 000 "The bug being fixed" (a cancellation is one of the wakes) and "Inline-
    eligibility latch ... cancellation can wake any run mid-step". In treadle a cancel is
    the terminal ``run_cancelled``: a replay after it has no pending set, so whatever the
    kill switch says, no delivery re-queues the running inline step. The marker is
    recorded once, the run ends cancelled, and the owner's late outcome changes nothing."""
    scene = await start_mid_step(
        make_app,
        faulty,
        wake="cancel",
        ownership_on=ownership_on,
        lease_seconds=LEASE,
        steps_elsewhere=True,
    )
    first = await scene.first_start()
    assert first.correlation_id is not None
    await scene.do_wake()
    await scene.until_log("run_cancelled", _has("run_cancelled"))
    owner = first.event.owner_message_id
    assert owner is not None
    # Every delivery but the owner's (the cancel's wake, if one was sent) has answered.
    await scene.faulty.queue.until(
        lambda: all(
            scene.answered(s) for s in scene.faulty.queue.started if s.meta.message_id != owner
        )
    )
    assert scene.marker == [1]
    scene.release.set()
    await scene.faulty.queue.until(
        lambda: all(scene.answered(s) for s in scene.deliveries_of(owner))
    )
    with pytest.raises(RunCancelledError):
        await scene.run.result(timeout=20)
    assert scene.marker == [1], "the cancel's replay ran the body again"
    assert not scene.step_sends(first.correlation_id), "a replay re-queued the step"
    assert (await scene.run.status()) == "cancelled"


async def test_the_kill_switch_keeps_stamping_the_owner_but_reverts_dispatch(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 000 "Wire format, compatibility, and rollout": "WORKFLOW_INLINE_OWNERSHIP=0
    reverts dispatch to the unconditional immediate requeue. Stamping continues (it is
    inert data)". The lazy inline start still names the delivery running the body; the
    hook's wake sends the step's own message at once (keyed ``step:<run>:<cid>``, no
    delay), never a backstop."""
    scene = await start_mid_step(
        make_app, faulty, wake="hook", ownership_on=False, lease_seconds=LEASE, steps_elsewhere=True
    )
    first = await scene.first_start()
    owner = first.event.owner_message_id
    assert owner is not None, "stamping continues under the kill switch"
    (ran_it,) = {s.meta.message_id for s in scene.deliveries_of(owner)}
    assert ran_it == owner
    await scene.do_wake()
    assert first.correlation_id is not None
    cid = first.correlation_id
    await scene.faulty.queue.until(lambda: bool(scene.step_sends(cid)))
    (requeue, *_) = scene.step_sends(cid)
    assert requeue.send is not None and requeue.send.delay_seconds == 0
    assert requeue.by is not None and requeue.by.meta.message_id != owner, (
        "the wake's delivery re-queued the step"
    )
    assert not scene.backstops()
    scene.release.set()
    assert await scene.run.result(timeout=20) == "charged o-1"


async def test_a_backstop_firing_while_the_owner_is_mid_body_is_absorbed_in_process(
    make_app: MakeApp, faulty: FaultyWorld, caplog: pytest.LogCaptureFixture
) -> None:
    """Seed 000 "Why in-process single-flight is a required layer": one process, a lease
    of 1 s. A hook wake arms the backstop; it fires while the owner is still mid-body, the
    lease has run out, so dispatch falls to the immediate keyed enqueue, and the step's
    message lands in the process that runs the body. The single-flight loser waits for the
    winner's settlement, then acks without executing: the body ran once, and a warn log
    names the absorption."""
    caplog.set_level(logging.WARNING, logger="treadle")
    scene = await start_mid_step(make_app, faulty, wake="hook", lease_seconds=1.0)
    first = await scene.first_start()
    owner = first.event.owner_message_id
    assert owner is not None
    await scene.do_wake()

    def absorbed() -> bool:
        return any(_absorption(r, scene.run.run_id) for r in caplog.records)

    try:
        await scene.faulty.queue.until(absorbed, timeout=20)
    except TimeoutError:
        raise AssertionError(
            f"no absorption was logged; marker {scene.marker}; sends "
            f"{[t.name for t in faulty.trace if t.what == 'send']}"
        ) from None
    assert scene.backstops(), "the wake armed a backstop"
    assert scene.marker == [1], "the backstop's path ran the body beside the owner"
    scene.release.set()
    assert await scene.run.result(timeout=20) == "charged o-1"
    assert scene.marker == [1]
    log = await scene.log()
    assert _types(log).count("step_completed") == 1
    (warning,) = {r.getMessage() for r in caplog.records if _absorption(r, scene.run.run_id)}
    assert first.correlation_id is not None and first.correlation_id in warning

    def loser_acked() -> bool:
        """The loser (the step's message) was acknowledged once the winner settled."""
        answers = [a for a in faulty.queue.answers if a.kind == "step"]
        return bool(answers) and answers[-1].result == messages.ACK

    await faulty.queue.until(loser_acked)
    assert not [a for a in faulty.queue.answers if a.error is not None]
    assert scene.marker == [1]


def _absorption(record: logging.LogRecord, run_id: str) -> bool:
    text = record.getMessage()
    return (
        record.levelno == logging.WARNING
        and run_id in text
        and "already running in this process" in text
    )


def _types(log: list[events.LoggedEvent]) -> list[str]:
    return [e.type for e in log]


def _has(event_type: str) -> Callable[[list[events.LoggedEvent]], bool]:
    return lambda log: event_type in _types(log)
