"""Overlapping deliveries and timers that arrive while another delivery holds the run.

Seed 003 "Lease stall overlap", "Two deliveries of one message, one dies owing
a send", "A new wait's creator coalesced away" and "Coalesced timer losing its
re-arm" (EDGE-CASES A1, B2, C1, C3; audit rows A1, B2, C1, C3), and "Coalesced
re-run outliving its lease" (audit BF2), on both Worlds.

A delivery is made stale the only way a live one can be: its event loop is
blocked past the lease (``time.sleep``), so its heartbeat misses and the queue
gives the message to the next delivery; after that the stale delivery is held
on an ``asyncio.Event`` while the new one runs, so the two really overlap. A
delivery that must hold its run (so that other messages coalesce into it) is
held at its start by ``FaultyQueue.hold_deliveries``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from treadle import Hook, errors, sleep
from treadle.world import contract, events, messages

from .audit import assert_sound, cold_outcome, types
from .conftest import MakeApp, OpenWorld
from .faults import FaultyWorld, Started, until_coalesced

SHORT_LEASE = contract.QueueTuning(
    lease_seconds=0.9, backoff_base_seconds=0.05, backoff_max_seconds=0.2
)
# A failed delivery comes back after about half a second: time for a hook wake to hold the run.
SLOW_BACKOFF = contract.QueueTuning(
    lease_seconds=5.0, backoff_base_seconds=0.6, backoff_max_seconds=0.6
)


def _stall_past_the_lease() -> None:
    time.sleep(SHORT_LEASE.lease_seconds * 2)  # the stall under test: the loop is blocked


def _start_message(s: Started) -> bool:
    return isinstance(s.message, messages.OrchestratorMessage) and s.message.run_input is not None


def _plain_wake(s: Started) -> bool:
    m = s.message
    return (
        isinstance(m, messages.OrchestratorMessage)
        and m.run_input is None
        and m.wait_continuation is None
        and not m.complete_waits
    )


@pytest.mark.parametrize("max_retries", [3, 0])
async def test_lease_stall_overlap_writes_nothing_twice(
    open_world: OpenWorld, make_app: MakeApp, max_retries: int
) -> None:
    """Audit A1 / seed 003 "Lease stall overlap": D1 runs an inline body and stalls past its
    lease; the message goes to D2 while D1 is still alive. D2 runs the step again (attempt 2)
    or, with max_retries=0, fails it without a second start; D1's late write is refused and
    D1 never answers Ack. One outcome, run_completed last, and a cold replay agrees."""
    world = FaultyWorld(await open_world(SHORT_LEASE))
    app = make_app(world=world)
    attempts: list[int] = []
    release_d1 = asyncio.Event()

    @app.step(max_retries=max_retries)
    async def crunch() -> str:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            _stall_past_the_lease()
            await release_d1.wait()
        return f"crunched-{len(attempts)}"

    @app.workflow
    async def flow() -> str:
        try:
            return await crunch()
        except errors.StepFailed as exc:
            return f"failed: {exc}"

    run = await app.start(flow)
    start_id: list[str] = []

    def d2_is_running() -> bool:
        firsts = [s for s in world.queue.started if _start_message(s)]
        if firsts:
            start_id[:] = [firsts[0].meta.message_id]
        return any(
            s.meta.message_id in start_id and s.meta.delivery_count >= 2
            for s in world.queue.started
        )

    await world.queue.until(d2_is_running)
    # D2 acts on the open inline step: a second start (attempt 2) or StepAttemptsExhausted.
    expected = "step_completed" if max_retries else "step_failed"
    await world.queue.until(
        lambda: any(t.what == "write" and t.name == expected for t in world.trace)
    )
    release_d1.set()  # D1's body returns; its write comes after D2's: refused
    await world.queue.until(
        lambda: any(
            a.meta.message_id in start_id and a.meta.delivery_count == 1
            for a in world.queue.orchestrator_answers()
        )
    )
    output = await run.result(timeout=20)
    d1 = next(
        a
        for a in world.queue.orchestrator_answers()
        if a.meta.message_id in start_id and a.meta.delivery_count == 1
    )
    assert d1.error is None and d1.result == messages.Redeliver(1), (
        f"the stale D1 must answer Redeliver(1), never Ack: {d1.result or d1.error!r}"
    )

    log = await assert_sound(run)
    kinds = types(log)
    assert kinds[-1] == "run_completed" and kinds.count("run_completed") == 1
    assert kinds.count("step_completed") + kinds.count("step_failed") == 1
    if max_retries:
        assert attempts == [1, 2], "D2 ran the step again while D1 was stalled"
        assert output == "crunched-2"
    else:
        assert attempts == [1], "a max_retries=0 body started twice"
        assert output.startswith("failed")
    assert cold_outcome(flow, log) == ("completed", output)


async def test_two_deliveries_of_one_message_one_dies_owing_a_send(
    open_world: OpenWorld, make_app: MakeApp
) -> None:
    """Audit B2 / seed 003 "Two deliveries of one message, one dies owing a send": D1 and
    D2 of the start message load one snapshot; D1 commits step_created(s1) and dies before
    the send; D2's own step_created is refused (it owes nothing) and answers Redeliver(1),
    never Ack; D2's redelivery re-sends s1, which runs once."""
    world = FaultyWorld(await open_world(SHORT_LEASE))
    app = make_app(world=world, WORKFLOW_MAX_INLINE_STEPS=0)
    ran: list[str] = []

    @app.step
    async def work() -> str:
        ran.append("work")
        return "worked"

    @app.workflow
    async def flow() -> str:
        return await work()

    inner_batch = world.events.create_batch
    d1_committed = asyncio.Event()
    d2_writing = asyncio.Event()
    creations: list[int] = []

    async def overlapping(run_id: str, batch: Any, **kw: Any) -> Any:
        if not any(e.type == "step_created" for e in batch):
            return await inner_batch(run_id, batch, **kw)
        creations.append(1)
        if len(creations) == 1:  # D1: stalls with its write in flight until D2 has loaded
            _stall_past_the_lease()
            await d2_writing.wait()
            result = await inner_batch(run_id, batch, **kw)
            d1_committed.set()
            return result
        if len(creations) == 2:  # D2: loaded the same snapshot; writes after D1's commit
            d2_writing.set()
            await d1_committed.wait()
        return await inner_batch(run_id, batch, **kw)

    world.events.create_batch = overlapping  # type: ignore[method-assign]
    # D1 dies owing s1's message: its first send of s1 fails (a re-send is marked resent).
    world.queue.fail_sends(
        1,
        when=lambda s: isinstance(s.message, messages.StepMessage) and not s.message.step_resent,
    )
    run = await app.start(flow)
    assert await run.result(timeout=30) == "worked"
    assert ran == ["work"]
    answers = world.queue.orchestrator_answers()
    start = next(s for s in world.queue.started if _start_message(s)).meta.message_id
    d2 = [a for a in answers if a.meta.message_id == start and a.meta.delivery_count == 2]
    assert [a.result for a in d2] == [messages.Redeliver(1)], "the refused D2 must redeliver"
    resent = [s for s in world.queue.sent if getattr(s.message, "step_resent", False)]
    assert len(resent) == 1, "D2's redelivery re-sent s1 once"
    log = await assert_sound(run)
    assert types(log).count("step_created") == 1


class Ping(Hook):
    n: int


async def test_a_new_waits_creator_coalesced_away_still_completes_its_wait(
    open_world: OpenWorld, make_app: MakeApp
) -> None:
    """Audit C1 / seed 003 "A new wait's creator coalesced away": D sends w1's timer,
    commits wait_created(w1), then fails. While its redelivery is in backoff a hook wake
    holds the run, so the redelivery is coalesced into it; the holder owns no chain and
    w1 is longer than the near-due window, so only the timer sent before the commit can
    complete w1. It completes at its time, not before."""
    world = FaultyWorld(await open_world(SLOW_BACKOFF))
    app = make_app(world=world)
    # Past the 5 s near-due window even when the holder re-runs (about 1.5 s in), so no
    # delivery but the creator arms it (a re-run with nothing new re-arms near-due waits).
    nap = 9.0

    @app.workflow
    async def flow() -> str:
        ping, _ = await asyncio.gather(Ping.wait(token="c1-ping"), sleep(nap))
        return f"woke {ping.n}"

    inner_batch = world.events.create_batch
    failed: list[float] = []

    async def lose_the_answer(run_id: str, batch: Any, **kw: Any) -> Any:
        result = await inner_batch(run_id, batch, **kw)
        if not failed and any(e.type == "wait_created" for e in batch):
            failed.append(time.time())
            raise ConnectionError("injected: the answer to wait_created was lost")
        return result

    world.events.create_batch = lose_the_answer  # type: ignore[method-assign]
    release = asyncio.Event()
    world.queue.hold_deliveries(_plain_wake, release)
    run = await app.start(flow)
    await world.queue.until(lambda: bool(failed) and _answered_with_error(world))
    await app.resume_hook("c1-ping", Ping(n=1))
    await world.queue.until(lambda: any(_plain_wake(s) for s in world.queue.started))
    # The creator's redelivery comes out of its backoff and is folded into the held wake.
    await until_coalesced(world, run.run_id)
    release.set()
    assert await run.result(timeout=20) == "woke 1"

    start = next(s for s in world.queue.started if _start_message(s)).meta.message_id
    alone = [
        s for s in world.queue.started if s.meta.message_id == start and s.meta.delivery_count > 1
    ]
    assert alone == [], "the creator's redelivery ran alone instead of coalescing"
    assert any(s.meta.rerun >= 1 for s in world.queue.started if _plain_wake(s))
    log = await assert_sound(run)
    created = next(e for e in log if e.type == "wait_created")
    done = next(e for e in log if e.type == "wait_completed")
    assert isinstance(created.event, events.WaitCreated)
    assert done.created_at >= created.event.resume_at
    wait_id = created.correlation_id
    timers = [t for t in world.trace if t.what == "send" and t.correlation_id == wait_id]
    commit = next(t for t in world.trace if t.what == "write" and t.name == "wait_created")
    assert timers and timers[0].seq < commit.seq, "w1's timer went out before wait_created"
    assert all(t.by is not None and t.by.meta.message_id == start for t in timers)


def _answered_with_error(world: FaultyWorld) -> bool:
    return any(a.error is not None for a in world.queue.orchestrator_answers())


async def test_a_coalesced_timer_is_completed_by_the_holder_which_arms_the_next(
    open_world: OpenWorld, make_app: MakeApp
) -> None:
    """Audit C3 / seed 003 "Coalesced timer losing its re-arm": w1 and w2 open in one chain;
    a hook wake holds the run when w1's timer comes due, so the timer coalesces into it.
    The holder completes w1 and arms w2 (its timer sent by the holder, before the
    wait_completed(w1) commit); the timer never runs alone; both waits complete once."""
    world = FaultyWorld(await open_world())
    app = make_app(world=world)
    first, second = 1.0, 4.5  # w2 still ahead when the holder runs, 1.6 s after w1

    @app.workflow
    async def flow() -> str:
        ping, _, _ = await asyncio.gather(Ping.wait(token="c3-ping"), sleep(first), sleep(second))
        return f"slept {ping.n}"

    run = await app.start(flow)
    await world.queue.until(
        lambda: (
            len([t for t in world.trace if t.name == "wait_created"]) == 2
            and any(a.result == messages.ACK for a in world.queue.orchestrator_answers())
        )
    )
    log = await run.events()
    waits = sorted(
        (e.event.resume_at, e.correlation_id)
        for e in log
        if isinstance(e.event, events.WaitCreated)
    )
    (_, w1), (_, w2) = waits
    release = asyncio.Event()
    world.queue.hold_deliveries(_plain_wake, release)
    await app.resume_hook("c3-ping", Ping(n=3))
    await world.queue.until(lambda: any(_plain_wake(s) for s in world.queue.started))
    # w1's timer comes due (NATS rounds a delay up to the second) and is folded in.
    await until_coalesced(world, run.run_id)
    release.set()
    assert await run.result(timeout=20) == "slept 3"

    holder = next(s for s in world.queue.started if _plain_wake(s)).meta.message_id
    alone = [
        s
        for s in world.queue.started
        if isinstance(s.message, messages.OrchestratorMessage)
        and s.message.wait_continuation is not None
        and s.message.wait_continuation.correlation_id == w1
    ]
    assert alone == [], "w1's timer ran alone: it was not coalesced into the holder"
    log = await assert_sound(run)
    assert types(log).count("wait_completed") == 2
    w1_done = next(t for t in world.trace if t.name == "wait_completed" and t.correlation_id == w1)
    assert w1_done.by is not None and w1_done.by.meta.message_id == holder
    armed = [
        t
        for t in world.trace
        if t.what == "send"
        and t.correlation_id == w2
        and t.by is not None
        and t.by.meta.message_id == holder
    ]
    assert armed and armed[0].seq < w1_done.seq, "the holder armed w2 before completing w1"


async def test_coalesced_re_runs_outliving_the_lease_keep_it(
    open_world: OpenWorld, make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    """Audit BF2 / seed 003 "Coalesced re-run outliving its lease": the first delivery works
    (awaits) for two leases, a wake is coalesced into it, and its re-run works two leases
    more. The heartbeat spans the re-runs: the lease is never lost, the message is never
    delivered again beside or after the holder, and the run completes."""
    world = FaultyWorld(await open_world(SHORT_LEASE))
    app = make_app(world=world, WORKFLOW_ORCHESTRATOR_LINGER_MS=0)
    span = SHORT_LEASE.lease_seconds * 2

    @app.workflow
    async def flow() -> str:
        ping = await Ping.wait(token="bf2-ping")
        return f"got {ping.n}"

    first_go, rerun_go = asyncio.Event(), asyncio.Event()
    world.queue.hold_deliveries(lambda s: _start_message(s) and s.meta.rerun == 0, first_go)
    world.queue.hold_deliveries(lambda s: _start_message(s) and s.meta.rerun == 1, rerun_go)
    caplog.set_level(logging.WARNING, logger="treadle")
    run = await app.start(flow)
    await world.queue.until(lambda: bool(world.queue.started))
    record = await run.get()
    await world.queue.send(
        messages.OrchestratorMessage(
            run_id=run.run_id, deployment_id=record.deployment_id, run_spec_version=9
        )
    )
    loop = asyncio.get_running_loop()
    loop.call_later(span, first_go.set)  # the holder at work for two leases
    await world.queue.until(lambda: any(s.meta.rerun == 1 for s in world.queue.started))
    loop.call_later(span, rerun_go.set)  # and its re-run for two more
    await world.queue.until(
        lambda: any(a.meta.rerun == 1 for a in world.queue.orchestrator_answers())
    )
    start = world.queue.started[0].meta.message_id
    again = [s for s in world.queue.started if s.meta.message_id == start and s.meta.rerun == 0]
    assert len(again) == 1, "the message was delivered again: the lease lapsed"
    lost = [r for r in caplog.records if "lost its lease" in r.getMessage()]
    assert lost == []
    await app.resume_hook("bf2-ping", Ping(n=2))
    assert await run.result(timeout=10) == "got 2"
