"""Audit rows on handoffs and the inline window, end to end (seed 003 "Handoffs",
"Attempt accounting"; audit F5, QE6, QE4).

A run whose deliveries each use up their inline window hands its message off again
and again. Each queue bounds that (``messages.handoff_counted``): past
``constants.MAX_HANDOFFS`` handoffs of one message a further ``Handoff`` is an
ordinary, counted reschedule, so ``attempt`` climbs and WORKFLOW_MAX_QUEUE_DELIVERIES
ends a run that would hand off for ever. The tests read every delivery's
``DeliveryMeta`` and answer through ``FaultyQueue`` and count them, on both Worlds.
"""

from __future__ import annotations

import asyncio

import pytest

from treadle.world import constants, messages

from .audit import assert_sound, types
from .conftest import MakeApp
from .faults import Answer, FaultyWorld

# A one-second inline window (the least WORKFLOW_V2_TIMEOUT_MS allows), no margin: each
# delivery runs two 0.6 s inline steps, the second one past the window's end, then hands off.
WINDOW = {"WORKFLOW_V2_TIMEOUT_MS": 1000, "WORKFLOW_INLINE_STEP_DEADLINE_MARGIN_MS": 0}


def _start_answers(world: FaultyWorld) -> list[Answer]:
    """The answers to deliveries of the run's start message, in order."""
    return [
        a
        for a in world.queue.orchestrator_answers()
        if a.meta.message_id == world.queue.orchestrator_answers()[0].meta.message_id
    ]


async def test_a_run_handing_off_past_the_bound_gets_counted_reschedules(
    faulty: FaultyWorld, make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Audit F5 and QE6 / seed 003 "Handoffs": ten 0.6 s inline steps in a row under a one
    second inline window; every delivery hands off. The first MAX_HANDOFFS (2 here)
    handoffs are not counted (attempt stays 1); every later one is a counted reschedule
    (attempt 2, 3, ...), the same on the local queue and on NATS. The run completes."""
    monkeypatch.setattr(constants, "MAX_HANDOFFS", 2)
    app = make_app(world=faulty, **WINDOW)

    @app.step
    async def work(i: int) -> int:
        await asyncio.sleep(0.6)
        return i

    @app.workflow
    async def flow() -> int:
        total = 0
        for i in range(10):
            total += await work(i)
        return total

    run = await app.start(flow)
    assert await run.result(timeout=40) == sum(range(10))
    log = await assert_sound(run)
    assert types(log).count("step_completed") == 10
    answers = _start_answers(faulty)
    handoffs = [a for a in answers if a.result == messages.HANDOFF]
    assert len(handoffs) >= 4, f"only {len(handoffs)} handoffs: the window never ran out"
    assert answers[-1].result == messages.ACK
    attempts = [a.meta.attempt for a in answers]
    counts = [a.meta.delivery_count for a in answers]
    assert counts == list(range(1, len(answers) + 1)), counts
    # Deliveries 1-3 are the first and two uncounted handoffs; each later one was counted.
    assert attempts == [1, 1, 1, *range(2, len(answers) - 1)], attempts


async def test_a_run_that_never_stops_handing_off_fails_at_the_delivery_cap(
    faulty: FaultyWorld, make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Audit F5 and QE6 (the hot handoff loop of Bug 4): a run whose every delivery hands off
    is bounded on both queues. Past MAX_HANDOFFS (2) the handoffs count as attempts, and
    the delivery whose attempt exceeds WORKFLOW_MAX_QUEUE_DELIVERIES (2) fails the run
    (MAX_DELIVERIES_EXCEEDED) and acks: exactly 5 deliveries, never a spin."""
    monkeypatch.setattr(constants, "MAX_HANDOFFS", 2)
    app = make_app(world=faulty, WORKFLOW_MAX_QUEUE_DELIVERIES=2, **WINDOW)

    @app.step
    async def work(i: int) -> int:
        await asyncio.sleep(0.6)
        return i

    @app.workflow
    async def flow() -> int:
        total = 0
        for i in range(40):
            total += await work(i)
        return total

    run = await app.start(flow)
    with pytest.raises(Exception, match="MAX_QUEUE_DELIVERIES|delivered 3 times"):
        await run.result(timeout=40)
    log = await assert_sound(run)
    assert types(log)[-1] == "run_failed"
    answers = _start_answers(faulty)
    assert [a.meta.attempt for a in answers] == [1, 1, 1, 2, 3]
    assert [a.result for a in answers] == [messages.HANDOFF] * 4 + [messages.ACK]
