"""Audit rows on a fence refusal while inline bodies run (seed 003 "Fence edge cases":
"Refusal while bodies run"; "Delivery": the refused invocation "sends the queue messages
its own committed writes still owe"; audit A3, SE4).

The refusals are injected in front of the World (``FaultyEvents.refuse_in_band``),
the slow and failed sends by ``FaultyQueue.hold_sends`` / ``fail_sends``; every
write and send is traced with the delivery that made it, so each test can say which
delivery wrote or sent what, and in which order.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable

import pytest

from treadle import RetryableError
from treadle.world import events, messages

from .audit import assert_sound
from .conftest import MakeApp
from .faults import FaultyWorld


def _step_send(name: str, attempt: int) -> Callable[[messages.Send], bool]:
    def matches(s: messages.Send) -> bool:
        m = s.message
        return (
            isinstance(m, messages.StepMessage)
            and m.step_name.endswith(name)
            and m.step_attempt == attempt
        )

    return matches


def _outcome_of(name: str) -> Callable[[events.Event], bool]:
    def matches(e: events.Event) -> bool:
        return e.type == "step_completed" and getattr(e, "step_name", "").endswith(name)

    return matches


async def test_an_owed_retry_message_goes_out_once_after_a_refusal_and_supersession_wins(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit SE4 and A3 ("supersession wins over other errors"): two inline bodies. flaky
    raises RetryableError: its step_retrying commits and its retry message's send is slow.
    Meanwhile other's outcome is refused by the fence. Then flaky's send fails
    (ConnectionError). The delivery answers Redeliver(1), not the send's error; after
    its bodies settle it sends the retry message it still owes, once; flaky's attempt 2
    runs once, from that message; the run completes."""
    app = make_app(world=faulty)
    ran: Counter[str] = Counter()
    other_go = asyncio.Event()

    @app.step(max_retries=3)
    async def flaky() -> str:
        ran[f"flaky{ran['flaky'] + 1}"] += 1
        ran["flaky"] += 1
        if ran["flaky"] == 1:
            raise RetryableError("once")
        return "flaky"

    @app.step
    async def other() -> str:
        ran["other"] += 1
        if ran["other"] == 1:
            await other_go.wait()
        return "other"

    @app.workflow
    async def flow() -> list[str]:
        return list(await asyncio.gather(flaky(), other()))

    send_go = asyncio.Event()
    faulty.queue.hold_sends(_step_send("flaky", 2), send_go)
    faulty.queue.fail_sends(1, when=_step_send("flaky", 2))
    faulty.events.refuse_in_band(1, when=_outcome_of("other"))
    run = await app.start(flow)
    await faulty.queue.until(lambda: bool(faulty.queue.held_sends))
    other_go.set()  # other's outcome now goes to the World, and is refused
    await faulty.queue.until(lambda: not faulty.events.refusals[0].times)
    send_go.set()  # flaky's send goes on, and fails
    assert await run.result(timeout=20) == ["flaky", "other"]
    first = faulty.queue.orchestrator_answers()[0]
    assert first.result == messages.Redeliver(1.0), f"supersession lost to {first.error!r}"
    retry_sends = [t for t in faulty.trace if t.send is not None and _step_send("flaky", 2)(t.send)]
    owed = [t for t in retry_sends if t.by is not None and t.by.meta == first.meta]
    assert len(owed) == 1, "the refused delivery did not send the retry message it owed"
    log = await assert_sound(run)
    flaky_starts = [
        e.event.attempt
        for e in log
        if isinstance(e.event, events.StepStarted) and e.event.step_name.endswith("flaky")
    ]
    assert flaky_starts == [1, 2], flaky_starts
    assert [e.type for e in log].count("step_retrying") == 1
    assert ran["flaky1"] == 1 and ran["flaky2"] == 1, ran


async def test_a_refusal_while_bodies_settle_after_another_failure_still_wins(
    make_app: MakeApp, faulty: FaultyWorld, caplog: pytest.LogCaptureFixture
) -> None:
    """Audit A3 ("supersession wins over other errors", the other order): flaky's retry
    message cannot be sent (ConnectionError), so its body fails first; the delivery stops
    deciding and lets other settle; other's outcome is then refused by the fence. The
    delivery was superseded: it answers Redeliver(1), not the send's error, and sends
    what it owes (flaky's retry message, committed with its step_retrying)."""
    app = make_app(world=faulty)
    ran: Counter[str] = Counter()
    other_go = asyncio.Event()

    @app.step(max_retries=3)
    async def flaky() -> str:
        ran["flaky"] += 1
        if ran["flaky"] == 1:
            raise RetryableError("once")
        return "flaky"

    @app.step
    async def other() -> str:
        ran["other"] += 1
        if ran["other"] == 1:
            await other_go.wait()
        return "other"

    @app.workflow
    async def flow() -> list[str]:
        return list(await asyncio.gather(flaky(), other()))

    faulty.queue.fail_sends(1, when=_step_send("flaky", 2))
    faulty.events.refuse_in_band(1, when=_outcome_of("other"))
    caplog.set_level(logging.WARNING, logger="treadle.orchestrator")
    run = await app.start(flow)
    await faulty.queue.until(lambda: not faulty.queue.send_faults[0].times)
    # The failed body is reaped by the delivery's pass loop at once (its task is done); a
    # moment for that before other settles, so the send's error is the first one seen.
    await asyncio.sleep(0.3)
    other_go.set()
    assert await run.result(timeout=20) == ["flaky", "other"]
    first = faulty.queue.orchestrator_answers()[0]
    assert first.result == messages.Redeliver(1.0), f"supersession lost to {first.error!r}"
    # The timeline happened in this order: the send's failure first, then the refusal.
    assert [r for r in caplog.records if "failed (injected" in r.getMessage()]
    owed = [
        t
        for t in faulty.trace
        if t.send is not None
        and _step_send("flaky", 2)(t.send)
        and t.by is not None
        and t.by.meta == first.meta
    ]
    assert len(owed) == 1, "the refused delivery did not send the retry message it owed"
    assert ran == Counter({"flaky": 2, "other": 2})
    await assert_sound(run)


async def test_no_body_starts_after_a_refusal(make_app: MakeApp, faulty: FaultyWorld) -> None:
    """Audit A3 ("no body starts after the refusal"): left = fast() then after(); right =
    slow(). fast and slow finish together; fast's outcome commits, slow's is refused. The
    pass that fast's outcome wakes would start after() inline: it must not, in that
    delivery (its start is never written by it, its body runs once, in the redelivery).
    Run-ahead off: under it after() starts ahead, beside its start's write (seed 003 "Step
    bodies a run-ahead stop can run twice"; tests/engine/test_run_ahead.py)."""
    app = make_app(world=faulty, WORKFLOW_RUN_AHEAD_DEPTH=0)
    ran: Counter[str] = Counter()
    go = asyncio.Event()

    @app.step
    async def fast() -> str:
        ran["fast"] += 1
        await go.wait()
        return "fast"

    @app.step
    async def slow() -> str:
        ran["slow"] += 1
        await go.wait()  # woken right after fast: its outcome queues behind fast's
        return "slow"

    @app.step
    async def after() -> str:
        ran["after"] += 1
        return "after"

    async def left() -> str:
        return await fast() + await after()

    @app.workflow
    async def flow() -> list[str]:
        return list(await asyncio.gather(left(), slow()))

    faulty.events.refuse_in_band(1, when=_outcome_of("slow"))
    run = await app.start(flow)
    await faulty.queue.until(lambda: ran["slow"] == 1 and ran["fast"] == 1)
    go.set()
    assert await run.result(timeout=20) == ["fastafter", "slow"]
    first = faulty.queue.orchestrator_answers()[0]
    assert first.result == messages.Redeliver(1.0)
    by_first = [t for t in faulty.trace if t.by is not None and t.by.meta == first.meta]
    assert not [t for t in by_first if t.what == "write" and t.name == "step_started"][2:], (
        "the refused delivery started a body after the refusal"
    )
    assert ran["after"] == 1, ran
    log = await assert_sound(run)
    after_starts = [
        e for e in log if e.type == "step_started" and e.event.step_name.endswith("after")
    ]
    assert len(after_starts) == 1
