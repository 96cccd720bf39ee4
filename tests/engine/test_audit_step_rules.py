"""Audit BF18, the smaller step fixes (seed 003 "Step ownership and data",
``WORKFLOW_MAX_QUEUE_DELIVERIES``, ``WORKFLOW_STEP_RETRY_DELAY_SECONDS``): a failed
step's retry is spaced by the retry delay, inline or background; a step message past
the delivery cap fails its step only when the step showed no activity for an hour,
and keeps running while it is still starting.

The hour is made with an offset ``treadle.clock`` (the engine reads every clock
through it; the Worlds stamp their rows with their own clocks), installed only once
the step's creation is in the log, so the step looks an hour old to the handler.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter

from treadle import RetryableError, clock
from treadle.errors import StepFailed
from treadle.world import events

from .audit import assert_sound, types
from .conftest import MakeApp
from .faults import FaultyWorld


def _starts(log: list[events.LoggedEvent], name: str) -> list[events.LoggedEvent]:
    return [
        e
        for e in log
        if isinstance(e.event, events.StepStarted) and e.event.step_name.endswith(name)
    ]


async def test_step_retries_without_retry_after_are_spaced_by_the_retry_delay(
    faulty: FaultyWorld, make_app: MakeApp
) -> None:
    """Audit BF18 (retry spacing): an inline step and a background step each raise
    RetryableError (no retry_after) twice. With WORKFLOW_STEP_RETRY_DELAY_SECONDS=0.6
    every next attempt starts at least 0.6 s after the failure before it (the inline
    step's retry moves to its own message, sent with that delay)."""
    app = make_app(world=faulty, WORKFLOW_STEP_RETRY_DELAY_SECONDS=0.6, WORKFLOW_MAX_INLINE_STEPS=1)
    ran: Counter[str] = Counter()

    @app.step(max_retries=3)
    async def near() -> str:
        ran["near"] += 1
        if ran["near"] <= 2:
            raise RetryableError("not yet")
        return "near"

    @app.step(max_retries=3)
    async def far() -> str:
        ran["far"] += 1
        if ran["far"] <= 2:
            raise RetryableError("not yet")
        return "far"

    @app.workflow
    async def flow() -> list[str]:
        return list(await asyncio.gather(near(), far()))

    run = await app.start(flow)
    assert await run.result(timeout=30) == ["near", "far"]
    log = await assert_sound(run)
    assert types(log).count("step_retrying") == 4
    for name in ("near", "far"):
        retrying = [
            e.created_at
            for e in log
            if isinstance(e.event, events.StepRetrying) and e.event.step_name.endswith(name)
        ]
        starts = [e.created_at for e in _starts(log, name)]
        assert len(starts) == 3, (name, starts)
        gaps = [(s - r).total_seconds() for r, s in zip(retrying, starts[1:], strict=True)]
        assert min(gaps) >= 0.55, f"{name}: retries {gaps} s after their failures"


async def test_a_step_past_the_delivery_cap_keeps_running_while_it_is_still_starting(
    faulty: FaultyWorld, make_app: MakeApp
) -> None:
    """Audit BF18 (the 1 h stall window, its active half): WORKFLOW_MAX_QUEUE_DELIVERIES=1;
    a background step's start write fails on its first two deliveries (a storage error).
    Its third delivery is past the cap, but the step was created moments ago: it is not
    failed as MAX_DELIVERIES_EXCEEDED, it starts and completes."""
    app = make_app(world=faulty, WORKFLOW_MAX_QUEUE_DELIVERIES=1, WORKFLOW_MAX_INLINE_STEPS=0)

    @app.step
    async def work() -> str:
        return "done"

    @app.workflow
    async def flow() -> str:
        return await work()

    faulty.events.fail_writes(2, when=lambda e: e.type == "step_started")
    run = await app.start(flow)
    assert await run.result(timeout=20) == "done"
    # The third delivery's answer is recorded when its handler returns, which may be
    # after the run's result is read (seen under xdist load): wait for it.
    await faulty.queue.until(lambda: sum(a.kind == "step" for a in faulty.queue.answers) >= 3)
    step_answers = [a for a in faulty.queue.answers if a.kind == "step"]
    assert [a.meta.attempt for a in step_answers] == [1, 2, 3]
    assert [a.error is not None for a in step_answers] == [True, True, False]
    log = await assert_sound(run)
    assert "MAX_DELIVERIES_EXCEEDED" not in str([e.event for e in log])


class _AnHourOn:
    """The system clock an hour and a minute ahead (monotonic time unchanged)."""

    def time(self) -> float:
        return time.time() + 3660

    def monotonic(self) -> float:
        return time.monotonic()

    def random_bytes(self, n: int) -> bytes:
        return os.urandom(n)


async def test_a_step_past_the_delivery_cap_idle_for_an_hour_is_failed(
    faulty: FaultyWorld, make_app: MakeApp
) -> None:
    """Audit BF18 (the 1 h stall window, its idle half) / seed 003
    ``WORKFLOW_MAX_QUEUE_DELIVERIES``: a background step's first delivery fails before
    its start (a storage error); its redelivery, past the cap (1), finds no creation,
    start or retry in the last hour: the step fails with MAX_DELIVERIES_EXCEEDED, which
    the workflow catches, and its body never ran."""
    app = make_app(world=faulty, WORKFLOW_MAX_QUEUE_DELIVERIES=1, WORKFLOW_MAX_INLINE_STEPS=0)
    ran: list[int] = []

    @app.step
    async def work() -> str:
        ran.append(1)
        return "done"

    @app.workflow
    async def flow() -> str:
        try:
            return await work()
        except StepFailed as exc:
            return f"caught {exc}"

    faulty.events.fail_writes(1, when=lambda e: e.type == "step_started")
    run = await app.start(flow)
    await faulty.queue.until(
        lambda: any(a.kind == "step" and a.error is not None for a in faulty.queue.answers)
    )
    with clock.use(_AnHourOn()):
        outcome = await run.result(timeout=20)
    assert "MAX_DELIVERIES_EXCEEDED" in outcome or "exceeded its deliveries" in outcome, outcome
    assert ran == []
    log = await assert_sound(run)
    failed = [e.event for e in log if isinstance(e.event, events.StepFailed)]
    assert len(failed) == 1 and failed[0].error.code == "MAX_DELIVERIES_EXCEEDED"


async def test_a_refused_batch_item_gets_no_message_its_committed_neighbours_do(
    faulty: FaultyWorld, make_app: MakeApp
) -> None:
    """Audit BF18 (refused batch item) / seed 003 "Delivery": three background steps are
    created in one batch and the World refuses the middle item. The delivery sends the
    messages of the two committed creations only, then fails with the item's error; its
    redelivery creates the refused step and sends it; each body runs once."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=0)
    ran: Counter[int] = Counter()

    @app.step
    async def work(i: int) -> int:
        ran[i] += 1
        return i

    @app.workflow
    async def flow() -> int:
        return sum(await asyncio.gather(work(0), work(1), work(2)))

    created: list[events.Event] = []

    def middle(e: events.Event) -> bool:
        if e.type == "step_created":
            created.append(e)
        return len(created) == 2 and e is created[1]

    faulty.events.refuse_items(1, when=middle)
    run = await app.start(flow)
    assert await run.result(timeout=20) == 3
    refused_id = created[1].correlation_id
    first = faulty.queue.orchestrator_answers()[0]
    assert first.error is not None and "refused" in str(first.error)
    sent_by_first = [
        t.correlation_id
        for t in faulty.trace
        if t.what == "send" and t.by is not None and t.by.meta == first.meta
    ]
    assert len(sent_by_first) == 2 and refused_id not in sent_by_first, sent_by_first
    assert ran == Counter({0: 1, 1: 1, 2: 1})
    log = await assert_sound(run)
    assert types(log).count("step_created") == 3
