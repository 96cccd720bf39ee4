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

from treadle import Hook, clock
from treadle.world import constants, messages

from .audit import assert_sound, types
from .conftest import MakeApp
from .faults import Answer, FaultyWorld, Started

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
    with pytest.raises(Exception, match=r"MAX_QUEUE_DELIVERIES|delivered 3 times"):
        await run.result(timeout=40)
    log = await assert_sound(run)
    assert types(log)[-1] == "run_failed"
    answers = _start_answers(faulty)
    assert [a.meta.attempt for a in answers] == [1, 1, 1, 2, 3]
    assert [a.result for a in answers] == [messages.HANDOFF] * 4 + [messages.ACK]


class Ping(Hook):
    n: int


def _plain(s: Started, rerun: int) -> bool:
    m = s.message
    return (
        isinstance(m, messages.OrchestratorMessage)
        and m.run_input is None
        and m.wait_continuation is None
        and not m.complete_waits
        and s.meta.rerun == rerun
    )


async def test_a_coalesced_re_run_measures_its_inline_window_from_the_deliverys_start(
    faulty: FaultyWorld, make_app: MakeApp
) -> None:
    """Audit QE4 (orchestrator side) / seed 003 "Attempt accounting": a plain wake W is held
    at its start while a second wake is coalesced into it; W's first run finds nothing new,
    so the queue re-runs it. That re-run is held past W's one-second inline window (from
    ``invocation_started_at``), and the hook is resumed meanwhile: the re-run has news, but
    its window is over, so it hands off at once, starting no step. (Measured from the
    re-run's own start it would run the three steps itself and ack.)"""
    app = make_app(world=faulty, WORKFLOW_ORCHESTRATOR_LINGER_MS=0, **WINDOW)
    ran: list[int] = []

    @app.step
    async def work(i: int) -> int:
        ran.append(i)
        await asyncio.sleep(0.2)
        return i

    @app.workflow
    async def flow() -> int:
        ping = await Ping.wait(token="qe4-ping")
        return ping.n + sum([await work(i) for i in range(3)])

    run = await app.start(flow)
    await faulty.queue.until(lambda: any(t.name == "hook_created" for t in faulty.trace))
    await faulty.queue.until(lambda: bool(faulty.queue.orchestrator_answers()))
    first_go, rerun_go = asyncio.Event(), asyncio.Event()
    faulty.queue.hold_deliveries(lambda s: _plain(s, 0), first_go)
    faulty.queue.hold_deliveries(lambda s: _plain(s, 1), rerun_go)
    record = await (await app.world()).runs.get(run.run_id)
    wake = messages.OrchestratorMessage(
        run_id=run.run_id,
        deployment_id=record.deployment_id,
        run_spec_version=record.spec_version,
    )
    await faulty.queue.send(wake)
    await faulty.queue.until(lambda: any(_plain(s, 0) for s in faulty.queue.started))
    await faulty.queue.send(wake)  # coalesced into the held delivery: it is re-run
    first_go.set()
    await faulty.queue.until(lambda: any(_plain(s, 1) for s in faulty.queue.started))
    held = next(s for s in faulty.queue.started if _plain(s, 1))
    await app.resume_hook("qe4-ping", Ping(n=100))
    # The re-run starts only once the delivery's window (from its first run) is over.
    started_at = held.meta.invocation_started_at
    await asyncio.sleep(max(0.0, started_at + 1200 - clock.now_ms()) / 1000)
    rerun_go.set()
    assert await run.result(timeout=20) == 103
    rerun = next(a for a in faulty.queue.orchestrator_answers() if a.meta == held.meta)
    assert rerun.meta.invocation_started_at == started_at
    assert rerun.result == messages.HANDOFF, f"the re-run answered {rerun.result!r}"
    assert not [t for t in faulty.trace if t.by is held and t.what == "write"], (
        "the re-run wrote past its delivery's inline window"
    )
    assert sorted(ran) == [0, 1, 2]
    await assert_sound(run)
