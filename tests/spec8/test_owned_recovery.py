"""Seed 000's recovery paths after the owner of an inline step dies mid-body, on spec 8
runs of the local World and of Postgres + NATS.

A ``treadle worker`` subprocess runs the inline step of ``spec8_workflows.py``; its first
attempt hangs, and the test kills the worker with SIGKILL inside the body. The rest is
served by a worker in this process on the same World (procs.py), recorded by a
``FaultyWorld``: owned recovery on the queue's redelivery of the owner's own message,
and, when that message is out of reach, recovery through the backstop after the lease.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from treadle.orchestrator.spec8 import ownership
from treadle.world import events

from . import spec8_workflows
from .faults8 import DeliveryFaultsWorld
from .procs import Cluster


async def _owner_of_the_first_start(cluster: Cluster, run_id: str) -> str:
    """The message id the lazy inline start stamped (read before this process serves)."""
    world = await cluster.open_world(2.0)
    try:
        page = await world.events.list(run_id, after_slot=0)
    finally:
        await world.close()
        cluster.worlds.remove(world)
    (start, *_) = [e for e in page.events if isinstance(e.event, events.StepStarted)]
    assert start.event.owner_message_id is not None
    return start.event.owner_message_id


def _starts(log: list[events.LoggedEvent]) -> list[events.LoggedEvent]:
    return [e for e in log if isinstance(e.event, events.StepStarted)]


async def test_the_owner_message_redelivered_after_a_crash_re_runs_its_owned_step(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Seed 000 "Why the identity is the queue messageId" and the decision table's
    "Created, ownership active, owner === myMessageId: execute in this invocation (owned
    recovery ...; the bare step_started re-stamps)". The worker running the inline body
    is killed; the queue redelivers the same message id; that delivery executes the owned
    step again, its ``step_started`` (attempt 2) re-stamped with the same owner, and the
    run completes. A warn log says owned recovery ran (a prior delivery died mid-body)."""
    caplog.set_level(logging.WARNING, logger="treadle")
    run_id = await cluster.start("owned", "r")
    first = cluster.start_worker(
        TREADLE_TEST_HANG_FIRST_ATTEMPT="1",
        TREADLE_QUEUE_LEASE_SECONDS="1.5",
        WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS="60",
    )
    cluster.wait_for_line("r start 1", first)
    cluster.kill(first)

    app, faulty = await cluster.serve_here(1.5, WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS=60)
    run = app.get_run(run_id)
    assert await run.result(timeout=30) == "r:2"
    assert cluster.lines() == ["r start 1", "r start 2", "r done 2"]

    log = await run.events()
    starts = _starts(log)
    owner = starts[0].event.owner_message_id
    assert owner is not None
    assert [s.event.attempt for s in starts] == [1, 2]
    assert starts[1].event.owner_message_id == owner, "owned recovery re-stamps the owner"
    redelivered = [
        s for s in faulty.queue.started if s.kind == "orchestrator" and s.meta.message_id == owner
    ]
    assert redelivered, "the queue redelivered the owner's own message"
    assert redelivered[0].meta.delivery_count >= 2
    restamp = [t for t in faulty.trace if t.what == "write" and t.name == "step_started"]
    assert restamp and restamp[0].by is not None and restamp[0].by.meta.message_id == owner
    assert not [t for t in faulty.trace if ":backstop:" in t.name], "no backstop was needed"
    assert [e.type for e in log].count("step_completed") == 1
    recovered = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and run_id in r.getMessage() and "recover" in r.getMessage()
    ]
    assert recovered, "a warn log says owned recovery ran"


async def test_a_dead_owner_whose_message_is_gone_is_recovered_by_the_backstop(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 000 "Why ownership requires a lease" (owner-message loss the SDK never
    observes) and "Why the non-owner action is a delayed backstop wake" (owner dead with
    lease expired: immediate dispatch, preserving step-level failure for poison steps).

    The owner is killed mid-body with an ownership lease of 4 s, and its message is
    purged: the queue's redelivery of it is taken off unrun (faults8.py; the local World
    redelivers a dead process's messages at once, NATS after the queue lease). A hook
    wake replays the run: the step is owned by a dead message, so the wake arms the
    backstop ``<cid>:backstop:<lastStartedAt>``, delayed by the lease's remainder, and
    acks. The backstop fires after the lease, finds it expired, and sends the step's own
    message at once (keyed ``step:<run>:<cid>``); the body runs on the background path (a
    bare ``step_started``, attempt 2). It is a poison step: it fails there step-level,
    and the workflow catches the failure and completes."""
    lease = 4.0
    monkeypatch.setenv("TREADLE_TEST_POISON", "1")
    run_id = await cluster.start("owned_with_hook", "p")
    first = cluster.start_worker(
        TREADLE_TEST_HANG_FIRST_ATTEMPT="1",
        TREADLE_QUEUE_LEASE_SECONDS="2",
        WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS=str(lease),
    )
    cluster.wait_for_line("p start 1", first)
    cluster.kill(first)
    owner = await _owner_of_the_first_start(cluster, run_id)

    app, faulty = await cluster.serve_here(
        2.0,
        wrap=lambda world: DeliveryFaultsWorld(world, purged={owner}),
        WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS=lease,
    )
    run = app.get_run(run_id)
    await app.resume_hook("go:p", {"go": True})
    assert await run.result(timeout=30) == "caught FatalError: poison step p"
    assert cluster.lines() == ["p start 1", "p start 2", "p poisoned 2"]

    log = await run.events()
    starts = _starts(log)
    assert [s.event.attempt for s in starts] == [1, 2]
    assert starts[0].event.owner_message_id == owner
    assert starts[1].event.owner_message_id is None, "the background path's start is bare"
    cid = starts[0].correlation_id
    assert cid is not None
    key = ownership.backstop_key(cid, starts[0].created_at)
    armed = [t for t in faulty.trace if t.what == "send" and t.name == key]
    assert armed, f"no backstop keyed {key}; sends {[t.name for t in faulty.trace]}"
    assert armed[0].send is not None and 0 < armed[0].send.delay_seconds <= lease
    fired = [s for s in faulty.queue.started if s.meta.key == key]
    assert fired, "the backstop was delivered"
    enqueued = [t for t in faulty.trace if t.what == "send" and t.name == f"step:{run_id}:{cid}"]
    assert enqueued and enqueued[0].by is fired[0], "the backstop sent the step's message"
    assert enqueued[0].send is not None and enqueued[0].send.delay_seconds == 0
    waited = (starts[1].created_at - starts[0].created_at).total_seconds()
    assert waited >= lease - 0.5, f"the body ran again {waited:.2f} s in, inside the lease"
    types = [e.type for e in log]
    assert types.count("step_failed") == 1
    assert types[-1] == "run_completed"
    assert not [s for s in faulty.queue.started if s.meta.message_id == owner], (
        "the owner's message was purged, never run"
    )


async def test_a_wake_during_owned_recovery_defers_to_the_re_stamped_owner(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 000 "Latest step_started wins ... This is why owner recovery must re-stamp its
    bare start: an unstamped recovery start would read as unowned to a later wake, which
    would immediately requeue the step the owner is re-running" and "The backstop key must
    change when ownership is re-stamped". The owner is killed mid-body; its redelivery
    re-runs the step (attempt 2, re-stamped) and blocks there. A hook wake now replays
    the run: it does not re-queue the step, and the backstop it arms is keyed by the
    re-stamped start (the new ownership epoch), not the first one. Released, the
    recovered attempt completes the run; the body ran once per epoch, never twice."""
    gate = asyncio.Event()
    monkeypatch.setitem(spec8_workflows.GATES, "g", gate)
    run_id = await cluster.start("owned_with_hook", "g")
    first = cluster.start_worker(
        TREADLE_TEST_HANG_FIRST_ATTEMPT="1",
        TREADLE_QUEUE_LEASE_SECONDS="1.5",
        WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS="60",
    )
    cluster.wait_for_line("g start 1", first)
    cluster.kill(first)

    app, faulty = await cluster.serve_here(1.5, WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS=60)
    run = app.get_run(run_id)
    await faulty.queue.until(lambda: "g start 2" in cluster.lines())
    starts = _starts(await run.events())
    assert [s.event.attempt for s in starts] == [1, 2]
    owner = starts[0].event.owner_message_id
    assert owner is not None and starts[1].event.owner_message_id == owner
    cid = starts[0].correlation_id
    assert cid is not None
    epoch_2 = ownership.backstop_key(cid, starts[1].created_at)
    assert epoch_2 != ownership.backstop_key(cid, starts[0].created_at)

    await app.resume_hook("go:g", {"go": True})

    def armed() -> list[Any]:
        return [
            t
            for t in faulty.trace
            if t.what == "send"
            and ":backstop:" in t.name
            and t.by is not None
            and t.by.meta.message_id != owner
            and any(a.meta is t.by.meta for a in faulty.queue.answers)
        ]

    await faulty.queue.until(lambda: bool(armed()))
    assert {t.name for t in armed()} == {epoch_2}, "the backstop names the recovered epoch"
    assert not [t for t in faulty.trace if t.name == f"step:{run_id}:{cid}"], (
        "the wake re-queued the step the owner is re-running"
    )
    assert "g start 3" not in cluster.lines()
    gate.set()
    assert await run.result(timeout=20) == "g:2"
    assert cluster.lines() == ["g start 1", "g start 2", "g done 2"]


async def test_owned_recovery_of_a_max_retries_0_step_fails_it_unrun(cluster: Cluster) -> None:
    """Seed 000's decision table (owned recovery) under the at-most-once rule of
    ``max_retries=0`` (docs/spec8-orchestrator.md: "A max_retries=0 step that was already
    started is failed as exhausted, never run twice"). The owner dies mid-body; its
    redelivery owns the step but does not run the body again: the step fails as
    exhausted, the workflow catches it, and the body's side effect happened once."""
    run_id = await cluster.start("owned_at_most_once", "z")
    first = cluster.start_worker(
        TREADLE_TEST_HANG_FIRST_ATTEMPT="1",
        TREADLE_QUEUE_LEASE_SECONDS="1.5",
        WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS="60",
    )
    cluster.wait_for_line("z start 1", first)
    cluster.kill(first)

    app, faulty = await cluster.serve_here(1.5, WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS=60)
    run = app.get_run(run_id)
    assert await run.result(timeout=30) == "failed: StepAttemptsExhausted"
    assert cluster.lines() == ["z start 1"], "a max_retries=0 body ran twice"
    log = await run.events()
    owner = _starts(log)[0].event.owner_message_id
    assert [s for s in faulty.queue.started if s.meta.message_id == owner], (
        "the owner's message was redelivered here"
    )
    assert [e.type for e in log].count("step_failed") == 1
