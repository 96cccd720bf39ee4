"""Audit rows on re-sends after a lost send (seed 003 "A crash before the owed sends").

EDGE-CASES B1 and B3: a delivery commits a step's creation (or an inline step's
moved retry) and its send never reaches the queue; whichever later delivery of
the run is counted above 1 (a handoff continuation, a coalesced re-run, the
redelivery folded into a hook wake) re-sends it under its stable key, once, and
the step runs once. Both Worlds.
"""

from __future__ import annotations

import asyncio

import pytest

from treadle import Hook, RetryableError, Workflows, clock, settings
from treadle.orchestrator.delivery import OrchestratorDelivery
from treadle.world import contract, messages

from .audit import assert_sound, types
from .conftest import MakeApp, OpenWorld
from .faults import FaultyWorld, Started, Traced, until_coalesced

SLOW_BACKOFF = contract.QueueTuning(
    lease_seconds=5.0, backoff_base_seconds=0.6, backoff_max_seconds=0.6
)


class Ping(Hook):
    n: int


def _first_step_send(s: messages.Send) -> bool:
    return isinstance(s.message, messages.StepMessage) and not s.message.step_resent


def _plain_wake(s: Started) -> bool:
    m = s.message
    return (
        isinstance(m, messages.OrchestratorMessage)
        and m.run_input is None
        and m.wait_continuation is None
        and not m.complete_waits
    )


def _resends(world: FaultyWorld) -> list[Traced]:
    return [
        t
        for t in world.trace
        if t.send is not None
        and isinstance(t.send.message, messages.StepMessage)
        and t.send.message.step_resent
    ]


async def test_a_handoff_continuation_re_sends_a_step_whose_send_was_lost(
    faulty: FaultyWorld, make_app: MakeApp
) -> None:
    """Audit B1 (handoff variant): the first delivery commits two step creations, one run
    inline, the other (s1) sent, but s1's message never reaches the queue; the inline body
    outlasts the window and the delivery hands off. The continuation (counted above 1,
    same attempt) re-sends s1 under its key, once; each body runs once."""
    app = make_app(
        world=faulty,
        WORKFLOW_MAX_INLINE_STEPS=1,
        WORKFLOW_V2_TIMEOUT_MS=1000,
        WORKFLOW_INLINE_STEP_DEADLINE_MARGIN_MS=100,
    )
    ran: list[str] = []

    # Whichever of the two runs inline outlasts the 1 s window; the other's send is lost.
    @app.step
    async def slow() -> str:
        ran.append("slow")
        await asyncio.sleep(1.3)
        return "slow"

    @app.step
    async def work() -> str:
        ran.append("work")
        await asyncio.sleep(1.3)
        return "worked"

    @app.workflow
    async def flow() -> str:
        a, b = await asyncio.gather(slow(), work())
        return f"{a}+{b}"

    faulty.queue.drop_sends(1, when=_first_step_send)
    run = await app.start(flow)
    assert await run.result(timeout=20) == "slow+worked"
    assert sorted(ran) == ["slow", "work"]
    answers = faulty.queue.orchestrator_answers()
    assert answers[0].result == messages.HANDOFF, "the first delivery handed off"
    (lost,) = faulty.queue.dropped
    (resent,) = _resends(faulty)
    assert resent.send is not None and resent.send.key == lost.key
    assert resent.by is not None and resent.by.meta.message_id == answers[0].meta.message_id
    assert resent.by.meta.delivery_count > 1 and resent.by.meta.attempt == 1
    assert types(await assert_sound(run)).count("step_created") == 1


async def test_a_coalesced_re_run_re_sends_a_step_whose_send_was_lost(
    faulty: FaultyWorld, make_app: MakeApp
) -> None:
    """Audit B1 (coalesced re-run variant): a wake is coalesced into the first delivery
    while it runs; that delivery commits step_created(s1) and s1's send is lost. Its
    coalesced re-run (counted above 1) re-sends s1 under its key, once per invocation;
    s1 runs once."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=0, WORKFLOW_ORCHESTRATOR_LINGER_MS=0)
    ran: list[str] = []

    @app.step
    async def work() -> str:
        ran.append("work")
        return "worked"

    @app.workflow
    async def flow() -> str:
        return await work()

    release = asyncio.Event()
    faulty.queue.hold_deliveries(
        lambda s: getattr(s.message, "run_input", None) is not None, release
    )
    faulty.queue.drop_sends(1, when=_first_step_send)
    run = await app.start(flow)
    await faulty.queue.until(lambda: bool(faulty.queue.started))
    record = await run.get()
    await faulty.queue.send(
        messages.OrchestratorMessage(
            run_id=run.run_id, deployment_id=record.deployment_id, run_spec_version=9
        )
    )
    await until_coalesced(faulty, run.run_id)  # the queue folds the wake into the holder
    release.set()
    assert await run.result(timeout=20) == "worked"
    assert ran == ["work"]
    (lost,) = faulty.queue.dropped
    (resent,) = _resends(faulty)
    assert resent.send is not None and resent.send.key == lost.key
    assert resent.by is not None and resent.by.meta.rerun >= 1, "the coalesced re-run re-sent"
    assert resent.by.meta.message_id == faulty.queue.started[0].meta.message_id


async def test_a_creators_redelivery_coalesced_into_a_hook_wake_re_sends_its_step(
    open_world: OpenWorld, make_app: MakeApp
) -> None:
    """Audit B3 / seed 003 "Creator's redelivery coalesced away": D1 commits
    step_created(s1) and dies before the send. A hook wake holds the run when D1's
    redelivery comes, so the redelivery is coalesced into it; the holder's re-run re-sends
    s1 (D1 created it); s1 runs once and the run completes."""
    world = FaultyWorld(await open_world(SLOW_BACKOFF))
    app = make_app(world=world, WORKFLOW_MAX_INLINE_STEPS=0)
    ran: list[str] = []

    @app.step
    async def work() -> str:
        ran.append("work")
        return "worked"

    @app.workflow
    async def flow() -> str:
        ping, got = await asyncio.gather(Ping.wait(token="b3-ping"), work())
        return f"{got} {ping.n}"

    world.queue.fail_sends(1, when=_first_step_send)
    release = asyncio.Event()
    world.queue.hold_deliveries(_plain_wake, release)
    run = await app.start(flow)
    await world.queue.until(lambda: any(a.error for a in world.queue.orchestrator_answers()))
    await app.resume_hook("b3-ping", Ping(n=3))
    await world.queue.until(lambda: any(_plain_wake(s) for s in world.queue.started))
    await until_coalesced(world, run.run_id)  # D1's redelivery, folded into the hook wake
    release.set()
    assert await run.result(timeout=20) == "worked 3"
    assert ran == ["work"]
    start = world.queue.started[0].meta.message_id
    assert [s for s in world.queue.started if s.meta.message_id == start] == [
        world.queue.started[0]
    ], "D1's redelivery ran alone instead of coalescing"
    (resent,) = _resends(world)
    holder = next(s for s in world.queue.started if _plain_wake(s)).meta.message_id
    assert resent.by is not None and resent.by.meta.message_id == holder
    assert resent.by.meta.delivery_count > 1


async def test_a_moved_inline_retry_whose_send_was_lost_is_re_sent_by_the_holder(
    open_world: OpenWorld, make_app: MakeApp
) -> None:
    """Audit B3 (retry variant): an inline step fails once (RetryableError); D1 commits its
    step_retrying (the retry moved to the step's own message) and dies before sending that
    message. D1's redelivery coalesces into a hook wake; the holder's re-run re-sends the
    retry (attempt 2) under the step's key; the body runs twice in all, never concurrently."""
    world = FaultyWorld(await open_world(SLOW_BACKOFF))
    app = make_app(world=world)
    attempts: list[int] = []

    @app.step
    async def flaky() -> str:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            raise RetryableError("once", retry_after=0)
        return "steady"

    @app.workflow
    async def flow() -> str:
        ping, got = await asyncio.gather(Ping.wait(token="b3r-ping"), flaky())
        return f"{got} {ping.n}"

    world.queue.fail_sends(1, when=_first_step_send)
    release = asyncio.Event()
    world.queue.hold_deliveries(_plain_wake, release)
    run = await app.start(flow)
    await world.queue.until(lambda: any(a.error for a in world.queue.orchestrator_answers()))
    await app.resume_hook("b3r-ping", Ping(n=4))
    await world.queue.until(lambda: any(_plain_wake(s) for s in world.queue.started))
    await until_coalesced(world, run.run_id)  # D1's redelivery, folded into the hook wake
    release.set()
    assert await run.result(timeout=20) == "steady 4"
    assert attempts == [1, 2]
    (resent,) = _resends(world)
    assert isinstance(resent.send and resent.send.message, messages.StepMessage)
    assert resent.send is not None and resent.send.message.step_attempt == 2  # type: ignore[union-attr]
    holder = next(s for s in world.queue.started if _plain_wake(s)).meta.message_id
    assert resent.by is not None and resent.by.meta.message_id == holder
    log = await assert_sound(run)
    assert types(log).count("step_completed") == 1


class _Later:
    """The system clock, 25 hours on (past the 23 h re-send bound and a 24 h dedupe)."""

    def time(self) -> float:
        return clock.SYSTEM.time() + 25 * 3600

    def monotonic(self) -> float:
        return clock.SYSTEM.monotonic()

    def random_bytes(self, n: int) -> bytes:
        return clock.SYSTEM.random_bytes(n)


@pytest.mark.parametrize("late", [False, True])
async def test_the_re_send_rule_skips_creations_older_than_23_hours(
    faulty: FaultyWorld, late: bool
) -> None:
    """Audit B6 / seed 003 "The 23-hour re-send bound": a step is created and sent by the
    run's first delivery. A delivery counted above 1 re-sends it when it comes soon after;
    when it comes 25 h later (the orchestrator's clock on; the queue's dedupe window would
    have forgotten the key) it does not, so the step never gets a second message."""
    app = Workflows(world=faulty, settings_=settings.load({}, WORKFLOW_MAX_INLINE_STEPS=0,
                    WORKFLOW_ORCHESTRATOR_LINGER_MS=0),
                    worker=False)  # fmt: skip

    @app.step
    async def work() -> str:
        return "w"

    @app.workflow
    async def flow() -> str:
        return await work()

    try:
        run = await app.start(flow)
        rt = app.runtime(faulty)
        record = await run.get()
        wake = messages.OrchestratorMessage(
            run_id=run.run_id, deployment_id=record.deployment_id, run_spec_version=9
        )

        def meta(count: int) -> messages.DeliveryMeta:
            return messages.DeliveryMeta(
                message_id=f"m-b6-{count}", delivery_count=count, attempt=count,
                invocation_started_at=clock.now_ms(),
            )  # fmt: skip

        assert await OrchestratorDelivery(rt, wake, meta(1)).run() == messages.ACK
        first = [s for s in faulty.queue.sent if s.message.kind == "step"]
        assert len(first) == 1
        if late:
            with clock.use(_Later()):
                answer = await OrchestratorDelivery(rt, wake, meta(2)).run()
        else:
            answer = await OrchestratorDelivery(rt, wake, meta(2)).run()
        assert answer == messages.ACK
        resent = [s for s in faulty.queue.sent if s.message.kind == "step"][1:]
        if late:
            assert resent == [], "a creation over 23 h old was re-sent"
        else:
            assert [s.key for s in resent] == [first[0].key]
            assert isinstance(resent[0].message, messages.StepMessage)
            assert resent[0].message.step_resent
    finally:
        await app.close(grace_seconds=0)
        await faulty.close()
