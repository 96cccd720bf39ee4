"""Regression tests of the inline-step bugs of the engine audit (sections 5 and 6).

Each test recreates its bug's timeline on both Worlds (local, and Postgres + NATS)
through the fault-injecting ``faults.FaultyWorld``, waits on events (a body
holds until the fault under test fired; a loop watchdog measures stalls), and
asserts what the seed promises: one outcome per step, no body overlapping
itself, no body cut off by an error, no ``max_retries=0`` step failed unrun.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from treadle import Hook, RetryableError, sleep, step_metadata
from treadle.world import contract, events, messages
from treadle.worlds.local import LocalWorld

from .conftest import MakeApp, OpenWorld
from .faults import FaultyWorld

SHORT_LEASE = contract.QueueTuning(
    lease_seconds=1.0, backoff_base_seconds=0.05, backoff_max_seconds=0.2
)


def _outcomes(log: list[events.LoggedEvent]) -> Counter[str]:
    """Outcomes per step name (step_completed and step_failed)."""
    return Counter(
        e.event.step_name
        for e in log
        if isinstance(e.event, events.StepCompleted | events.StepFailed)
    )


def _exhausted(log: list[events.LoggedEvent]) -> list[str]:
    return [
        e.event.step_name
        for e in log
        if isinstance(e.event, events.StepFailed) and e.event.error.type == "StepAttemptsExhausted"
    ]


class LoopWatch:
    """The longest time the event loop went without running a 10 ms tick."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.longest = max(self.longest, now - last)
            last = now

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


@pytest.fixture
async def loop_watch() -> AsyncIterator[LoopWatch]:
    watch = LoopWatch()
    watch.start()
    yield watch
    watch.stop()


@pytest.mark.parametrize("max_retries", [1, 4])
async def test_an_inline_retry_moved_to_its_message_is_never_run_inline_again(
    make_app: MakeApp, faulty: FaultyWorld, max_retries: int
) -> None:
    """Bug 1 (audit section 5) and F1 (section 6): gather(flaky(), slow()); flaky raises
    RetryableError once, so its retry moves to its own message. slow settles while that
    background attempt runs, so the orchestrator makes a pass during it. The step is not
    run inline again nor failed as exhausted: one outcome per step, attempts never overlap."""
    app = make_app(world=faulty)
    running: Counter[str] = Counter()
    most: Counter[str] = Counter()
    attempts: list[int] = []
    background_started = asyncio.Event()
    slow_done = asyncio.Event()

    @app.step(max_retries=max_retries)
    async def flaky() -> str:
        attempt = step_metadata().attempt
        attempts.append(attempt)
        running["flaky"] += 1
        most["flaky"] = max(most["flaky"], running["flaky"])
        try:
            if attempt == 1:
                raise RetryableError("first attempt fails", retry_after=0.05)
            background_started.set()
            await slow_done.wait()  # slow's outcome lands, and a pass runs, during this one
            await asyncio.sleep(0.3)  # the body's own work, still running through that pass
            return f"flaky@{attempt}"
        finally:
            running["flaky"] -= 1

    @app.step
    async def slow() -> str:
        await background_started.wait()
        slow_done.set()
        return "slow"

    @app.workflow
    async def flow() -> list[str]:
        return list(await asyncio.gather(flaky(), slow()))

    run = await app.start(flow)
    assert await run.result(timeout=30) == ["flaky@2", "slow"]
    log = await run.events()
    assert _outcomes(log) == Counter({"flaky": 1, "slow": 1})
    assert _exhausted(log) == []
    assert attempts == [1, 2]
    assert most["flaky"] == 1
    restarts = [
        e.event
        for e in log
        if isinstance(e.event, events.StepStarted)
        and e.event.step_name == "flaky"
        and e.event.attempt > 1
    ]
    assert [(s.attempt, s.inline) for s in restarts] == [(2, False)]


async def test_a_failed_send_lets_a_running_inline_body_finish(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Bug 2 (audit section 5; seed 003 "A later batch fails", FO4): transfer
    (max_retries=0) runs inline; a later pass creates a background step whose send fails.
    The delivery fails only once transfer settled: its body is never cancelled, its
    outcome is written, it is not failed as exhausted, and the redelivery completes."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=1)
    send_failed = asyncio.Event()
    ran: Counter[str] = Counter()
    cancelled: list[str] = []

    @app.step(max_retries=0)
    async def transfer() -> str:
        ran["transfer"] += 1
        try:
            await send_failed.wait()
            await asyncio.sleep(0.2)  # mid side effect when the delivery's error is raised
        except asyncio.CancelledError:
            cancelled.append("transfer")
            raise
        return "moved"

    @app.step
    async def other() -> str:
        ran["other"] += 1
        return "other"

    async def later() -> str:
        await sleep(0.1)
        return await other()

    @app.workflow
    async def flow() -> list[str]:
        return list(await asyncio.gather(transfer(), later()))

    def fail_others_send(send: messages.Send) -> bool:
        message = send.message
        if isinstance(message, messages.StepMessage) and message.step_name == "other":
            send_failed.set()
            return True
        return False

    faulty.queue.fail_sends(1, when=fail_others_send)
    run = await app.start(flow)
    assert await run.result(timeout=30) == ["moved", "other"]
    assert send_failed.is_set()
    assert cancelled == []
    assert ran == Counter({"transfer": 1, "other": 1})
    log = await run.events()
    assert _exhausted(log) == []
    assert _outcomes(log) == Counter({"transfer": 1, "other": 1})
    failed = [a for a in faulty.queue.orchestrator_answers() if a.error is not None]
    assert failed and isinstance(failed[0].error, ConnectionError)


async def test_an_inline_body_starts_before_its_batchs_failing_send(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Bug 3 (a) (audit section 5; seed 003 "How the creations are split"): transfer
    (max_retries=0, inline) and other (background) are created in one batch, and other's
    send fails. transfer's body ran (it started when the batch committed), so the
    redelivery finds its outcome and does not fail it unrun."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=1)
    ran: Counter[str] = Counter()

    @app.step(max_retries=0)
    async def transfer() -> str:
        ran["transfer"] += 1
        return "moved"

    @app.step
    async def other() -> str:
        ran["other"] += 1
        return "other"

    @app.workflow
    async def flow() -> list[str]:
        return list(await asyncio.gather(transfer(), other()))

    faulty.queue.fail_sends(
        1,
        when=lambda s: (
            isinstance(s.message, messages.StepMessage) and s.message.step_name == "other"
        ),
    )
    run = await app.start(flow)
    assert await run.result(timeout=30) == ["moved", "other"]
    assert ran == Counter({"transfer": 1, "other": 1})
    log = await run.events()
    assert _exhausted(log) == []
    assert _outcomes(log) == Counter({"transfer": 1, "other": 1})


async def test_inline_bodies_of_the_first_batch_run_when_a_later_batch_is_refused(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Bug 3 (b) (audit section 5): a 70-step fan-out of max_retries=0 steps; the first
    batch (3 inline starts and 61 creations) commits, the second is refused by the fence.
    The 3 inline bodies ran before the delivery answered Redeliver; no step is failed as
    exhausted without its body having run, and no body runs twice."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=3)
    ran: Counter[str] = Counter()

    @app.step(max_retries=0)
    async def work(i: int) -> int:
        ran[step_metadata().step_id] += 1
        return i

    @app.workflow
    async def flow() -> int:
        return sum(await asyncio.gather(*(work(i) for i in range(70))))

    faulty.events.refuse_in_band(1, when=lambda e: e.type == "step_created")
    run = await app.start(flow)
    with contextlib.suppress(Exception):
        # A step whose refused outcome is lost fails the run (its body ran).
        await run.result(timeout=60)
    log = await run.events()
    assert isinstance(faulty.queue.orchestrator_answers()[0].result, messages.Redeliver)
    assert set(ran.values()) == {1}, "no body ran twice"
    first_batch = [
        e.event.correlation_id
        for e in log
        if isinstance(e.event, events.StepStarted) and e.event.inline and e.event.attempt == 1
    ][:3]
    assert all(ran[step_id] == 1 for step_id in first_batch), "the first batch's bodies ran"
    exhausted = [
        e.event.correlation_id
        for e in log
        if isinstance(e.event, events.StepFailed) and e.event.error.type == "StepAttemptsExhausted"
    ]
    assert all(ran[step_id] == 1 for step_id in exhausted), "a step failed unrun"
    per_step = Counter(
        e.event.correlation_id
        for e in log
        if isinstance(e.event, events.StepCompleted | events.StepFailed)
    )
    assert set(per_step.values()) == {1}, "a step has two outcomes"


async def test_an_inline_rerun_waits_for_a_free_slot_without_holding_the_loop(
    make_app: MakeApp, faulty: FaultyWorld, loop_watch: LoopWatch
) -> None:
    """Bug 4 (audit section 5): one inline slot. D1 runs a inline and is refused by the
    fence at a's outcome, so a is left started. D2 completes the due sleep, which creates x
    inline in the only slot; a must be re-run with no slot free. D2 waits for x to settle
    (the loop is never held; before the fix it spun until the inline window's end), then
    re-runs a."""
    # A short inline window, so the old spin (held until the window's end) fails quickly.
    app = make_app(
        world=faulty,
        WORKFLOW_MAX_INLINE_STEPS=1,
        WORKFLOW_V2_TIMEOUT_MS=8000,
        WORKFLOW_INLINE_STEP_DEADLINE_MARGIN_MS=1000,
    )
    order: list[str] = []

    @app.step(max_retries=2)
    async def a() -> str:
        order.append(f"a{step_metadata().attempt}")
        return "a"

    @app.step
    async def x() -> str:
        order.append("x-start")
        await asyncio.sleep(0.3)  # a body running while a waits for its slot
        order.append("x-end")
        return "x"

    async def later() -> str:
        await sleep(0.2)
        return await x()

    @app.workflow
    async def flow() -> list[str]:
        return list(await asyncio.gather(a(), later()))

    faulty.events.refuse_in_band(
        1, when=lambda e: e.type == "step_completed" and e.step_name == "a"
    )
    run = await app.start(flow)
    assert await run.result(timeout=30) == ["a", "x"]
    assert order == ["a1", "x-start", "x-end", "a2"]
    assert loop_watch.longest < 1.0, f"the event loop was held {loop_watch.longest:.2f} s"
    log = await run.events()
    assert _outcomes(log) == Counter({"a": 1, "x": 1})


@pytest.fixture
async def short_lease(
    request: pytest.FixtureRequest, tmp_path: Path, open_world: OpenWorld
) -> FaultyWorld:
    """The World under test (as ``open_world`` names it) with a 1 s lease."""
    if request.node.callspec.params["open_world"] == "local":
        return FaultyWorld(await LocalWorld(tmp_path / "short", tuning=SHORT_LEASE).open())
    from ..production.conftest import ProductionHarness

    harness = ProductionHarness(
        request.getfixturevalue("pg_dsn"), request.getfixturevalue("nats_server").url, "local"
    )
    return FaultyWorld(await harness.open(SHORT_LEASE))


class Ping(Hook):
    n: int


async def _until(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> float:
    """Poll ``check`` (a log or answer read) until it holds; the time it took."""
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < timeout, f"{what} within {timeout} s"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def test_a_delivery_that_lost_its_lease_stops_lingering_and_writes_nothing(
    make_app: MakeApp, short_lease: FaultyWorld
) -> None:
    """F3 (audit section 6): D1 ran pre inline and lingers on an open hook. The process
    stalls past the lease, so the queue sets D1's lease_lost and the message goes to D2.
    D1 stops at once (it answers long before its 20 s linger ends, never Ack); when the
    hook is resumed only the live delivery acts: after (max_retries=0) runs once and is
    not failed as exhausted."""
    world = short_lease
    app = make_app(world=world, WORKFLOW_ORCHESTRATOR_LINGER_MS=20_000)
    ran: Counter[str] = Counter()

    @app.step
    async def pre() -> str:
        ran["pre"] += 1
        return "pre"

    @app.step(max_retries=0)
    async def after(n: int) -> int:
        ran["after"] += 1
        await asyncio.sleep(0.2)
        return n

    @app.workflow
    async def flow() -> int:
        await pre()
        ping = await Ping.wait(token="f3-lease")
        return await after(ping.n)

    run = await app.start(flow)

    async def hook_open() -> bool:
        return any(e.type == "hook_created" for e in await run.events())

    await _until(hook_open, 15, "the hook was created")
    time.sleep(SHORT_LEASE.lease_seconds * 1.6)  # the fault: the process stalls past its lease

    async def stale_answered() -> bool:
        return any(a.meta.lost_lease() for a in world.queue.orchestrator_answers())

    took = await _until(stale_answered, 10, "the stale delivery answered")
    assert took < 5, f"the stale delivery lingered {took:.1f} s after it lost its lease"
    stale = [a for a in world.queue.orchestrator_answers() if a.meta.lost_lease()]
    assert all(a.error is None and not isinstance(a.result, messages.Ack) for a in stale)

    await app.resume_hook("f3-lease", {"n": 7})
    assert await run.result(timeout=30) == 7
    assert ran == Counter({"pre": 1, "after": 1})
    log = await run.events()
    assert _exhausted(log) == []
    assert _outcomes(log) == Counter({"pre": 1, "after": 1})


async def test_an_open_inline_step_with_no_slot_anywhere_moves_to_its_message(
    make_app: MakeApp, faulty: FaultyWorld, loop_watch: LoopWatch
) -> None:
    """Bug 4 (audit section 5), the handoff loop: a worker with WORKFLOW_MAX_INLINE_STEPS=0
    takes over a run whose inline step a refused delivery left started. No body runs there
    and no slot can free up, so instead of handing off for ever (2 527 handoffs in 3 s
    before the fix) its retry moves to the step's own message, which runs it once.
    Run-ahead off: the refusal is armed on a write that starts with the outcome."""
    first = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=1, WORKFLOW_RUN_AHEAD_DEPTH=0)
    attempts: list[tuple[int, str]] = []
    refused = asyncio.Event()

    def define(app: Any) -> Any:
        @app.step(max_retries=2)
        async def a() -> str:
            attempts.append((step_metadata().attempt, "run"))
            return "a"

        @app.workflow
        async def flow() -> str:
            return await a()

        return flow

    flow = define(first)

    def refuse_a(event: events.Event) -> bool:
        if event.type == "step_completed":
            refused.set()
            return True
        return False

    faulty.events.refuse_in_band(1, when=refuse_a)
    run = await first.start(flow)
    await asyncio.wait_for(refused.wait(), 15)

    async def first_answered() -> bool:
        return bool(faulty.queue.orchestrator_answers())

    await _until(first_answered, 15, "the refused delivery answered")
    await first.close(grace_seconds=2)  # its worker stops; the redelivery goes to `second`
    second = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=0)
    define(second)
    run = second.get_run(run.run_id)  # read through second: first stays closed
    assert await run.result(timeout=30) == "a"
    assert attempts == [(1, "run"), (2, "run")]
    handoffs = [
        a for a in faulty.queue.orchestrator_answers() if isinstance(a.result, messages.Handoff)
    ]
    assert handoffs == []
    log = await run.events()
    assert _outcomes(log) == Counter({"a": 1})
    moved = [e.event for e in log if isinstance(e.event, events.StepRetrying)]
    assert [m.creator_message_id is not None for m in moved] == [True]
    assert loop_watch.longest < 1.0


async def test_an_inline_bodys_own_error_lets_its_siblings_finish(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Bug 2 (audit section 5), the _reap_done path: flaky's retry moves to its message and
    that send fails, so flaky's task ends with ConnectionError while transfer
    (max_retries=0) is mid body. transfer finishes and its outcome is written before the
    delivery fails; the redelivery re-sends flaky's retry and the run completes."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=2)
    send_failed = asyncio.Event()
    ran: Counter[str] = Counter()
    cancelled: list[str] = []

    @app.step(max_retries=0)
    async def transfer() -> str:
        ran["transfer"] += 1
        try:
            await send_failed.wait()
            await asyncio.sleep(0.2)  # mid side effect when flaky's task fails
        except asyncio.CancelledError:
            cancelled.append("transfer")
            raise
        return "moved"

    @app.step(max_retries=2)
    async def flaky() -> str:
        ran[f"flaky{step_metadata().attempt}"] += 1
        if step_metadata().attempt == 1:
            raise RetryableError("once", retry_after=0.05)
        return "flaky"

    @app.workflow
    async def flow() -> list[str]:
        return list(await asyncio.gather(transfer(), flaky()))

    def fail_flakys_retry(send: messages.Send) -> bool:
        message = send.message
        if isinstance(message, messages.StepMessage) and message.step_name == "flaky":
            send_failed.set()
            return True
        return False

    faulty.queue.fail_sends(1, when=fail_flakys_retry)
    run = await app.start(flow)
    assert await run.result(timeout=30) == ["moved", "flaky"]
    assert send_failed.is_set()
    assert cancelled == []
    assert ran == Counter({"transfer": 1, "flaky1": 1, "flaky2": 1})
    log = await run.events()
    assert _exhausted(log) == []
    assert _outcomes(log) == Counter({"transfer": 1, "flaky": 1})
    failed = [a for a in faulty.queue.orchestrator_answers() if a.error is not None]
    assert failed and isinstance(failed[0].error, ConnectionError)
