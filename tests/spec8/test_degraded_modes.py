"""Seed 000's degraded modes on spec 8 runs, on the local World and Postgres + NATS:
unstable message ids recover through the backstop lease (never wedging, never
duplicating), and a retrying inline step leaves ownership for its own message with its
short backoff (backstop shape #1: never stalled a whole lease behind a backstop).
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from treadle.orchestrator.spec8 import ownership
from treadle.world import events

from ..engine.conftest import MakeApp, OpenWorld
from ..engine.faults import FaultyWorld, Traced
from .faults8 import DeliveryFaultsWorld, ShiftedStartsWorld
from .procs import Cluster
from .scenarios import expected_backstop_key, start_mid_step


def _starts(log: list[events.LoggedEvent]) -> list[events.LoggedEvent]:
    return [e for e in log if isinstance(e.event, events.StepStarted)]


async def test_unstable_message_ids_recover_a_crashed_owner_through_the_backstop_lease(
    cluster: Cluster,
) -> None:
    """Seed 000 "Worlds with unstable message IDs: there the lease is the entire recovery
    mechanism" and "Degraded modes": the owner is killed mid-body; the queue redelivers its
    message, but this World's queue gives every delivery a fresh id (faults8.py), so the
    owner check never matches, not even on the crashed owner's own redelivery. That
    redelivery defers and arms the backstop for the lease's remainder (a 5 s lease: NATS
    redelivers after its 1 s queue lease); the backstop finds the lease expired and sends
    the step's message; the body runs once more, on the background path, and the run
    completes: no wedge, no owned re-run, one completion."""
    lease = 5.0
    run_id = await cluster.start("owned", "u")
    first = cluster.start_worker(
        TREADLE_TEST_HANG_FIRST_ATTEMPT="1",
        TREADLE_QUEUE_LEASE_SECONDS="1",
        WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS=str(lease),
    )
    cluster.wait_for_line("u start 1", first)
    cluster.kill(first)

    app, faulty = await cluster.serve_here(
        1.0,
        wrap=lambda world: DeliveryFaultsWorld(world, fresh_ids=True),
        WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS=lease,
    )
    run = app.get_run(run_id)
    assert await run.result(timeout=30) == "u:2", "the run wedged"
    assert cluster.lines() == ["u start 1", "u start 2", "u done 2"]

    log = await run.events()
    starts = _starts(log)
    owner = starts[0].event.owner_message_id
    assert owner is not None
    assert [s.event.attempt for s in starts] == [1, 2]
    assert starts[1].event.owner_message_id is None, "no owned recovery could match"
    redelivery = [m for m in faulty.inner.queue.minted if m[0] == owner]
    assert redelivery, "the queue redelivered the owner's message (under a fresh id)"
    assert all(s.meta.message_id != owner for s in faulty.queue.started)
    cid = starts[0].correlation_id
    assert cid is not None
    key = ownership.backstop_key(cid, starts[0].created_at)
    assert [t for t in faulty.trace if t.what == "send" and t.name == key], "no backstop armed"
    assert [s for s in faulty.queue.started if s.meta.key == key], "the backstop never fired"
    waited = (starts[1].created_at - starts[0].created_at).total_seconds()
    assert waited >= lease - 0.5, f"the body ran again {waited:.2f} s in, inside the lease"
    assert [e.type for e in log].count("step_completed") == 1


async def test_a_retrying_inline_step_goes_to_its_message_after_its_backoff_not_a_lease(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 000 "step_retrying lapses ownership permanently" and backstop shape #1 ("the
        backstop must not be the step's own message ... the pending backstop absorbed it,
        turning a 1-second retry into a full-lease stall"). A hook wake arms a backstop (lease
        30 s) while charge's first attempt runs inline; the attempt then fails retryably. The
        retry goes to the step's own message (keyed ``step:<run>:<cid>``) with its ~1 s
        backoff, is not absorbed by the pending backstop, and runs as a bare start (the step
        is queue-owned now) once its backoff is over, about a second later, far inside the lease.
    (Whichever delivery replays first after ``step_retrying`` sends the step's message, the
    decision table's "ownership lapsed" row or the body's retry hand-off: both under the
    step's key, and the step handler holds the attempt until ``retry_after``.)"""
    lease = 30.0
    scene = await start_mid_step(
        make_app,
        faulty,
        wake="hook",
        lease_seconds=lease,
        fail_first=True,
        WORKFLOW_STEP_RETRY_DELAY_SECONDS=1.0,
    )
    first = await scene.first_start()
    cid = first.correlation_id
    assert cid is not None
    await scene.do_wake()
    await scene.faulty.queue.until(lambda: bool(scene.backstops()))
    scene.release.set()
    assert await scene.run.result(timeout=15) == "charged o-1"
    assert scene.marker == [1, 2]

    log = await scene.log()
    (retrying,) = [e for e in log if e.type == "step_retrying"]
    starts = _starts(log)
    assert [s.event.attempt for s in starts] == [1, 2]
    assert starts[1].event.owner_message_id is None, "a retry is queue-owned"
    after = (starts[1].created_at - retrying.created_at).total_seconds()
    assert after < 10, f"the retry stalled {after:.1f} s (the lease is {lease:.0f} s)"
    assert retrying.event.retry_after is not None
    early = (retrying.event.retry_after - starts[1].created_at).total_seconds()
    assert early < 0.25, f"the retry ran {early:.2f} s before its backoff was over"
    retries = scene.step_sends(cid)
    assert retries, "the retry went to the step's own message"
    (written,) = [t for t in faulty.trace if t.what == "write" and t.name == "step_retrying"]
    assert all(t.seq > written.seq for t in retries), "the step was queued before it failed"
    (backstop_key,) = {t.name for t in scene.backstops()}
    assert backstop_key != retries[0].name and backstop_key.startswith(f"{cid}:backstop:")


async def test_an_owner_redelivery_while_the_owner_still_runs_is_absorbed_in_process(
    make_app: MakeApp, open_world: OpenWorld, caplog: pytest.LogCaptureFixture
) -> None:
    """Seed 000 "Accepted residual risks: Redelivery-while-alive ... the owner check passes
    on a redelivery racing the live owner ... The in-process single-flight absorbs the
    same-instance case." While charge's inline body runs, the queue hands the owner's
    message to this process again (faults8.py: the hook's wake is delivered as a
    redelivery of the owner's id). Its replay finds the step owned by itself, but the
    body is already running here: the single-flight loser runs nothing, re-stamps
    nothing, and waits; the body ran once and the run completes with its result."""
    caplog.set_level(logging.WARNING, logger="treadle")
    faulty = FaultyWorld(DeliveryFaultsWorld(await open_world()))
    scene = await start_mid_step(make_app, faulty, wake="hook", lease_seconds=60.0)
    first = await scene.first_start()
    owner = first.event.owner_message_id
    assert owner is not None
    faults = faulty.inner.queue
    faults.redeliver_as = owner
    await scene.do_wake()
    await faulty.queue.until(lambda: bool(faults.impersonated))
    await faulty.queue.until(
        lambda: any(_absorbed(r, scene.run.run_id) for r in caplog.records), timeout=20
    )
    assert scene.marker == [1], "the owner's redelivery ran the body beside the owner"
    scene.release.set()
    assert await scene.run.result(timeout=20) == "charged o-1"
    assert scene.marker == [1]
    log = await scene.log()
    assert [e.event.attempt for e in _starts(log)] == [1], "the loser re-stamped the step"
    assert [e.type for e in log].count("step_completed") == 1


def _absorbed(record: logging.LogRecord, run_id: str) -> bool:
    text = record.getMessage()
    return record.levelno == logging.WARNING and run_id in text and "already running" in text


@pytest.mark.parametrize("start_times", ["unusable", "server-ahead"])
async def test_unusable_or_skewed_start_times_degrade_safely(
    make_app: MakeApp, open_world: OpenWorld, start_times: str
) -> None:
    """Seed 000 "Degraded modes are all today's behavior, never worse: ... missing/
    unusable event timestamps (lease remaining 0: immediate enqueue)" and "The upper clamp
    exists for clock skew". The World reports charge's ``step_started`` ten years in the
    past (faults8.py): the hook's wake finds no lease left and sends the step's message
    at once, arming no backstop; in this one worker the single-flight absorbs it, and the
    run completes with the body run once. Or it reports the start an hour ahead (the
    server's clock ahead of the delivery's): the remainder is clamped to the lease, and
    the backstop's delay is the lease, never more."""
    lease = 60.0
    shift = timedelta(days=-3650) if start_times == "unusable" else timedelta(hours=1)
    faulty = FaultyWorld(ShiftedStartsWorld(await open_world(), shift))
    scene = await start_mid_step(make_app, faulty, wake="hook", lease_seconds=lease)
    first = await scene.first_start()
    owner = first.event.owner_message_id
    cid = first.correlation_id
    assert owner is not None and cid is not None
    await scene.do_wake()

    def by_the_wake(sent: list[Traced]) -> list[Traced]:
        return [t for t in sent if t.by is not None and t.by.meta.message_id != owner]

    if start_times == "unusable":
        await faulty.queue.until(lambda: bool(by_the_wake(scene.step_sends(cid))))
        assert not scene.backstops(), "no lease is left to arm a backstop for"
    else:
        await faulty.queue.until(lambda: bool(by_the_wake(scene.backstops())))
        (armed, *_) = scene.backstops()
        assert armed.send is not None and armed.send.key == expected_backstop_key(first)
        assert lease - 1 <= armed.send.delay_seconds <= lease, "the skew clamp"
        assert not scene.step_sends(cid)
    scene.release.set()
    assert await scene.run.result(timeout=20) == "charged o-1"
    assert scene.marker == [1]
