"""Audit rows on single deliveries: refusals, ended runs, retries and caps (both Worlds).

EDGE-CASES A2 (the warn log of a refusal streak), A3 (no body starts after a
refusal), E4 (a plain first step delivery whose step_started is refused), E5
(a retry runs once, after its retry_after), E8/QE5 (non-finite Redeliver), SE13
(a step message past the delivery cap with no activity for an hour), FO2 (no
inline start inside the margin).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from treadle import RetryableError, clock
from treadle.orchestrator import steps as step_handler
from treadle.world import constants, events, messages

from .audit import assert_sound, types
from .conftest import MakeApp, OpenWorld
from .faults import CURRENT, FaultyWorld


async def test_each_fence_refusal_of_a_streak_is_logged_at_warning(
    make_app: MakeApp, faulty: FaultyWorld, caplog: pytest.LogCaptureFixture
) -> None:
    """Audit A2 (the warn log) / seed 003 "Refused with no winner": two deliveries in a row
    are refused by the fence; each refusal logs one warning naming the run, and the
    third delivery completes the run."""
    app = make_app(world=faulty)

    @app.workflow
    async def flow() -> str:
        return "done"

    faulty.events.refuse_in_band(2, when=lambda e: e.type == "run_started")
    caplog.set_level(logging.WARNING, logger="treadle.orchestrator")
    run = await app.start(flow)
    assert await run.result(timeout=20) == "done"
    refusals = [r for r in caplog.records if "refused by the fence" in r.getMessage()]
    assert len(refusals) == 2 and all(r.levelno == logging.WARNING for r in refusals)
    assert all(run.run_id in r.getMessage() for r in refusals)
    answers = faulty.queue.orchestrator_answers()
    assert [a.result for a in answers] == [messages.Redeliver(1)] * 2 + [messages.ACK]


async def test_no_body_starts_in_a_delivery_after_its_refusal(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit A3 ("no body starts after the refusal") / seed 003 "Refusal while bodies run":
    two inline bodies run; the first outcome's write is refused while the other still
    runs. It settles, but the step that would come next never starts in that delivery:
    every body started after the refusal belongs to a later delivery."""
    app = make_app(world=faulty)
    starts: list[tuple[str, int]] = []
    refused: list[int] = []
    slow_may_finish = asyncio.Event()

    def note(name: str) -> None:
        current = CURRENT.get()
        starts.append((name, current.meta.delivery_count if current else 0))

    @app.step
    async def fast() -> str:
        note("fast")
        await asyncio.sleep(0.05)  # both bodies are running when its outcome is refused
        return "fast"

    @app.step
    async def slow() -> str:
        note("slow")
        if not refused:
            await slow_may_finish.wait()
        return "slow"

    @app.step
    async def after() -> str:
        note("after")
        return "after"

    @app.workflow
    async def flow() -> list[str]:
        got = list(await asyncio.gather(fast(), slow()))
        return [*got, await after()]

    def refuse_first_outcome(event: events.Event) -> bool:
        if event.type == "step_completed" and not refused:
            refused.append(len(starts))
            slow_may_finish.set()
            return True
        return False

    faulty.events.refuse_in_band(1, when=refuse_first_outcome)
    run = await app.start(flow)
    assert await run.result(timeout=20) == ["fast", "slow", "after"]
    assert faulty.queue.orchestrator_answers()[0].result == messages.Redeliver(1)
    later = starts[refused[0] :]
    assert later and all(count >= 2 for _, count in later), (
        f"a body started in the refused delivery: {starts}"
    )
    assert [name for name, _ in starts].count("after") == 1
    await assert_sound(run)


async def test_a_plain_step_delivery_for_an_ended_run_is_refused_its_start_and_acks(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit E4 / seed 003 "Body before a refused start": a step's plain first delivery (not
    a re-send) comes after the run was cancelled; its step_started is refused (RunExpired),
    so it acks: no body, no wake, no step_started in the log."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=0)
    ran: list[str] = []

    @app.step
    async def work() -> str:
        ran.append("work")
        return "ran"

    record = await faulty.runs.create(
        workflow_name="none", input=None, deployment_id="local", spec_version=9
    )
    created = await faulty.events.create(
        record.run_id, events.StepCreated(correlation_id="step_e4", step_name="work"),
        in_band=False,
    )  # fmt: skip
    await faulty.events.create(record.run_id, events.RunCancelled(), in_band=False)
    step = messages.StepMessage(
        run_id=record.run_id, deployment_id="local", step_id="step_e4", step_name="work",
        step_created_at=created.event.created_at,
        run_context=messages.RunContext(spec_version=9, deployment_id="local",
                                        workflow_name="none"),
    )  # fmt: skip
    await app.world()
    await faulty.queue.send(step, key="step:e4")
    await faulty.queue.until(lambda: any(a.kind == "step" for a in faulty.queue.answers))
    (answer,) = [a for a in faulty.queue.answers if a.kind == "step"]
    assert answer.meta.delivery_count == 1 and answer.result == messages.ACK
    assert ran == []
    assert not [s for s in faulty.queue.sent if s.message.kind == "orchestrator"]
    log = [e.type for e in (await faulty.events.list(record.run_id, after_slot=0)).events]
    assert "step_started" not in log


async def test_a_background_retry_runs_once_and_not_before_its_retry_after(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit E5 and SE6 / seed 003 "Retry longer than one redelivery": a background step
    fails once asking retry_after=1.5 s; its message comes back; the body runs exactly
    once more, and its second start is not before the retry_after."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=0)
    runs: list[datetime] = []

    @app.step(max_retries=3)
    async def busy() -> str:
        runs.append(datetime.now(UTC))
        if len(runs) == 1:
            raise RetryableError("busy", retry_after=1.5)
        return "free"

    @app.workflow
    async def flow() -> str:
        return await busy()

    run = await app.start(flow)
    assert await run.result(timeout=20) == "free"
    assert len(runs) == 2, f"the body ran {len(runs)} times"
    log = await assert_sound(run)
    retrying = next(e for e in log if isinstance(e.event, events.StepRetrying))
    assert isinstance(retrying.event, events.StepRetrying) and retrying.event.retry_after
    second = [e for e in log if isinstance(e.event, events.StepStarted) and e.event.attempt == 2]
    assert len(second) == 1 and second[0].created_at >= retrying.event.retry_after
    assert runs[1] >= retrying.event.retry_after


async def _due_in_seconds(world: Any, message_id: str) -> float | None:
    """Seconds until the local queue has the message due again; None on another queue."""
    db = getattr(world.queue, "db", None)
    if db is None:
        return None

    def read(conn: Any) -> Any:
        return conn.execute(
            "SELECT available_at FROM queue_messages WHERE message_id = ?", (message_id,)
        ).fetchone()

    row = await db.call(read)
    assert row is not None, "the message left the queue"
    return float(row[0]) / 1e6 - time.time()


@pytest.mark.parametrize("seconds", [math.nan, math.inf])
async def test_a_non_finite_redeliver_is_clamped_to_the_longest_delay(
    open_world: OpenWorld, seconds: float
) -> None:
    """Audit E8 and QE5 / seed 003 "Non-finite timeout": a handler answers Redeliver(nan) or
    Redeliver(inf). The queue neither fails nor redelivers at once (as a 0 or a handoff
    would): the message is not back within 2 s and the consumer goes on serving."""
    world = await open_world()
    seen: list[str] = []
    news = asyncio.Event()

    async def handler(message: Any, meta: messages.DeliveryMeta) -> messages.HandlerResult:
        seen.append(message.run_id)
        news.set()
        return messages.Redeliver(seconds) if message.run_id == "wrun_odd" else messages.ACK

    consumer = await world.queue.consume({"orchestrator": handler})
    try:
        odd = await world.queue.send(messages.OrchestratorMessage(run_id="wrun_odd"))
        async with asyncio.timeout(10):
            while "wrun_odd" not in seen:
                news.clear()
                await news.wait()
        await world.queue.send(messages.OrchestratorMessage(run_id="wrun_next"))
        async with asyncio.timeout(10):
            while "wrun_next" not in seen:
                news.clear()
                await news.wait()
        due_in = await _due_in_seconds(world, odd.message_id)
        if due_in is not None:  # the local queue says when it is due again: about 900 s on
            assert due_in > constants.MAX_REDELIVER_SECONDS - 60, due_in
        # Asserting an absence (NATS keeps a nak's delay to itself): not back in a second.
        await asyncio.sleep(1.0)
        assert Counter(seen) == Counter({"wrun_odd": 1, "wrun_next": 1})
    finally:
        await consumer.close(grace_seconds=0)
        await world.close()


class _Later:
    """The system clock, two hours on: a step's last activity is then over an hour old."""

    def time(self) -> float:
        return clock.SYSTEM.time() + 7200

    def monotonic(self) -> float:
        return clock.SYSTEM.monotonic()

    def random_bytes(self, n: int) -> bytes:
        return clock.SYSTEM.random_bytes(n)


@pytest.mark.parametrize("idle", [True, False])
async def test_a_step_message_past_the_cap_fails_the_step_only_after_an_idle_hour(
    make_app: MakeApp, faulty: FaultyWorld, idle: bool
) -> None:
    """Audit SE13 / seed 003 "Step edge cases": a step message delivered past
    WORKFLOW_MAX_QUEUE_DELIVERIES fails its step with MAX_DELIVERIES_EXCEEDED, without the
    body, when the step saw no activity for an hour (the handler's clock two hours on);
    with recent activity it runs the body instead."""
    app = make_app(world=faulty, WORKFLOW_MAX_QUEUE_DELIVERIES=3)
    ran: list[str] = []

    @app.step
    async def work() -> str:
        ran.append("work")
        return "ran"

    record = await faulty.runs.create(
        workflow_name="none", input=None, deployment_id="local", spec_version=9
    )
    created = await faulty.events.create(
        record.run_id, events.StepCreated(correlation_id="step_se13", step_name="work"),
        in_band=False,
    )  # fmt: skip
    message = messages.StepMessage(
        run_id=record.run_id, deployment_id="local", step_id="step_se13", step_name="work",
        step_created_at=created.event.created_at, step_resent=True,
        run_context=messages.RunContext(spec_version=9, deployment_id="local",
                                        workflow_name="none"),
    )  # fmt: skip
    meta = messages.DeliveryMeta(
        message_id="m-se13", delivery_count=4, attempt=4, invocation_started_at=0
    )
    rt = app.runtime(faulty)
    if idle:
        with clock.use(_Later()):
            answer = await step_handler.handle_step_message(rt, message, meta)
    else:
        answer = await step_handler.handle_step_message(rt, message, meta)
    assert answer == messages.ACK
    log = (await faulty.events.list(record.run_id, after_slot=0)).events
    if idle:
        assert ran == []
        failed = [e.event for e in log if isinstance(e.event, events.StepFailed)]
        assert len(failed) == 1 and failed[0].error.code == "MAX_DELIVERIES_EXCEEDED"
    else:
        assert ran == ["work"]
        assert "step_completed" in [e.type for e in log]


async def test_no_inline_step_starts_inside_the_margin(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit FO2 and RL9 / seed 003 "Inside the margin": the delivery's window (1 s) is
    inside the inline-start margin (2 s) from the start, so its steps go to their own
    messages (step_created, sent) and none runs inline."""
    app = make_app(
        world=faulty,
        WORKFLOW_V2_TIMEOUT_MS=1000,
        WORKFLOW_INLINE_STEP_DEADLINE_MARGIN_MS=2000,
    )

    @app.step
    async def work(i: int) -> int:
        return i

    @app.workflow
    async def flow() -> int:
        return sum(await asyncio.gather(*(work(i) for i in range(3))))

    run = await app.start(flow)
    assert await run.result(timeout=20) == 3
    log = await assert_sound(run)
    assert all(not e.event.inline for e in log if isinstance(e.event, events.StepStarted))
    assert types(log).count("step_created") == 3
    sent = [s for s in faulty.queue.sent if s.message.kind == "step"]
    # One message per step. A delivery past its 1 s window may hand off, and its
    # continuation re-sends unstarted steps under their keys (the re-send rule): the
    # queue folds those into the same three messages.
    assert len({s.key for s in sent}) == 3
    assert all(
        s.message.step_resent for s in sent[3:] if isinstance(s.message, messages.StepMessage)
    )
    assert all(a.kind == "step" for a in faulty.queue.answers if a.meta.delivery_count == 1
               and a.kind == "step")  # fmt: skip
