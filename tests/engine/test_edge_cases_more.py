"""More of EDGE-CASES.md on the local World: refusals mid-work, ended runs, early timers."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from treadle import Workflows, sleep
from treadle.errors import RunCancelledError
from treadle.orchestrator import steps as step_handler
from treadle.orchestrator import timers
from treadle.world import events, messages
from treadle.worlds.local import LocalWorld

from .conftest import TUNING, MakeApp
from .faults import FaultyWorld


async def test_refusal_while_bodies_run_stops_every_later_write(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """A3: two inline bodies run; the first outcome's write is refused. The other body settles,
    its write is refused too, nothing more reaches the World, the answer is Redeliver(1);
    the redelivery runs both open steps again and the run completes. Run-ahead off: its
    refusal is armed on a write of one outcome (tests/engine/test_run_ahead.py has the
    run-ahead case)."""
    app = make_app(world=faulty, WORKFLOW_RUN_AHEAD_DEPTH=0)
    ran: Counter[str] = Counter()
    second_may_finish = asyncio.Event()

    @app.step
    async def fast() -> str:
        ran["fast"] += 1
        return "fast"

    @app.step
    async def slow() -> str:
        ran["slow"] += 1
        if ran["slow"] == 1:
            await second_may_finish.wait()
        return "slow"

    @app.workflow
    async def flow() -> list[str]:
        return list(await asyncio.gather(fast(), slow()))

    def refuse_first_outcome(event: events.Event) -> bool:
        if event.type == "step_completed":
            second_may_finish.set()
            return True
        return False

    faulty.events.refuse_in_band(1, when=refuse_first_outcome)
    run = await app.start(flow)
    assert await run.result(timeout=15) == ["fast", "slow"]
    first = faulty.queue.orchestrator_answers()[0]
    assert first.result == messages.Redeliver(1.0)
    log = await run.events()
    assert [e.type for e in log].count("step_completed") == 2
    starts = [e.event.attempt for e in log if e.type == "step_started"]
    assert sorted(starts) == [1, 1, 2, 2], "both open steps ran again after the refusal"
    assert ran == Counter({"fast": 2, "slow": 2})


async def test_fence_refusal_mid_fan_out_leaves_each_step_one_message(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """F2: 150 background steps go out in 64-event batches; the third batch is refused.
    The first two batches' steps have their messages; the redelivery creates the rest;
    every step runs exactly once."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=0)
    ran: Counter[int] = Counter()

    @app.step
    async def work(i: int) -> int:
        ran[i] += 1
        return i

    @app.workflow
    async def fan() -> int:
        return sum(await asyncio.gather(*(work(i) for i in range(150))))

    batches: list[int] = []

    def third_batch(event: events.Event) -> bool:
        if event.type == "step_created":
            batches.append(1)
            return len(batches) == 3
        return False

    faulty.events.refuse_in_band(1, when=third_batch)
    run = await app.start(fan)
    assert await run.result(timeout=30) == sum(range(150))
    assert ran == Counter({i: 1 for i in range(150)})
    created = [e for e in await run.events() if e.type == "step_created"]
    assert len(created) == 150 and len({e.correlation_id for e in created}) == 150


async def test_a_run_cancelled_before_its_first_delivery_writes_nothing_more(
    tmp_path: Path, make_app: MakeApp
) -> None:
    """G5: the run ended before its start message was delivered: Ack, nothing written,
    no step body run."""
    world = await LocalWorld(tmp_path / "world", tuning=TUNING).open()
    ran: list[str] = []
    client = Workflows(world=world, worker=False)

    @client.step
    async def work() -> str:
        ran.append("work")
        return "ran"

    @client.workflow
    async def flow() -> str:
        return await work()

    run = await client.start(flow)
    await run.cancel("changed my mind")
    app = make_app(world=world)
    app.workflow(flow.fn)
    app.step(work.fn)
    await app.world()
    with pytest.raises(RunCancelledError):
        await app.get_run(run.run_id).result(timeout=10)
    await asyncio.sleep(0.3)  # the start message's delivery: asserting it wrote nothing
    assert [e.type for e in await run.events()] == ["run_created", "run_cancelled"]
    assert ran == []


async def test_a_step_message_for_an_ended_run_acks_without_body_or_wake(
    tmp_path: Path, make_app: MakeApp
) -> None:
    """E4/E6: a step's message arrives after the run was cancelled: no body, no wake."""
    world = FaultyWorld(await LocalWorld(tmp_path / "world", tuning=TUNING).open())
    app = make_app(world=world, WORKFLOW_MAX_INLINE_STEPS=0)
    ran: list[str] = []

    @app.step
    async def work() -> str:
        ran.append("work")
        return "ran"

    run = await world.runs.create(
        workflow_name="none", input=None, deployment_id="local", spec_version=9
    )
    await world.events.create(run.run_id, events.RunCancelled(), in_band=False)
    step = messages.StepMessage(
        run_id=run.run_id, step_id="step_1", step_name="work", step_created_at=datetime.now(UTC),
        run_context=messages.RunContext(spec_version=9, workflow_name="none"), step_resent=True,
    )  # fmt: skip
    await world.queue.send(step, key="step:x")
    await app.world()
    deadline = time.monotonic() + 10
    while not [a for a in world.queue.answers if a.kind == "step"]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    (answer,) = [a for a in world.queue.answers if a.kind == "step"]
    assert answer.result == messages.ACK
    assert ran == []
    assert not [s for s in world.queue.sent if s.message.kind == "orchestrator"]


async def test_a_late_resent_copy_of_a_finished_step_reads_the_log_and_acks(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """B5: a re-send reaches the queue after the step finished: the copy (step_resent) reads
    the log, finds the outcome, sends one wake and acks without running the body."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=0)
    ran: Counter[str] = Counter()

    @app.step
    async def work() -> str:
        ran["work"] += 1
        return "done"

    @app.workflow
    async def flow() -> str:
        return await work()

    run = await app.start(flow)
    assert await run.result(timeout=10) == "done"
    original = next(s for s in faulty.queue.sent if s.message.kind == "step")
    assert isinstance(original.message, messages.StepMessage)
    copy = original.message.model_copy(update={"step_resent": True})
    await faulty.queue.send(copy, key=f"{original.key}:late-copy")
    deadline = time.monotonic() + 10
    while len([a for a in faulty.queue.answers if a.kind == "step"]) < 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    assert [a for a in faulty.queue.answers if a.kind == "step"][1].result == messages.ACK
    assert ran == Counter({"work": 1})


async def test_a_retry_not_yet_due_asks_for_the_rest_of_its_wait(
    tmp_path: Path, make_app: MakeApp
) -> None:
    """E5: a step message back before its retry_after (a clamped redelivery) asks again."""
    world = await LocalWorld(tmp_path / "world", tuning=TUNING).open()
    app = make_app(world=world)
    run = await world.runs.create(
        workflow_name="none", input=None, deployment_id="local", spec_version=9
    )
    due = datetime.now(UTC) + timedelta(hours=2)
    await world.events.create(
        run.run_id, events.StepCreated(correlation_id="s1", step_name="work"), in_band=False
    )
    await world.events.create(
        run.run_id, events.StepStarted(correlation_id="s1", step_name="work", attempt=1),
        in_band=False,
    )  # fmt: skip
    await world.events.create(
        run.run_id,
        events.StepRetrying(correlation_id="s1", step_name="work", attempt=1,
                            error=events.ErrorInfo(message="busy"), retry_after=due),
        in_band=False,
    )  # fmt: skip
    message = messages.StepMessage(
        run_id=run.run_id, step_id="s1", step_name="work", step_created_at=datetime.now(UTC),
        run_context=messages.RunContext(spec_version=9, workflow_name="none"),
    )  # fmt: skip
    meta = messages.DeliveryMeta(
        message_id="m", delivery_count=2, attempt=2, invocation_started_at=0
    )
    answer = await step_handler.handle_step_message(app.runtime(world), message, meta)
    assert isinstance(answer, messages.Redeliver)
    assert 2 * 3600 - 5 < answer.seconds <= 2 * 3600


async def test_a_refused_wait_completion_is_redelivered_and_completes_once(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """C8: the timer delivery's wait_completed is refused; it answers Redeliver(1); the
    redelivery completes the wait; the wait is completed exactly once."""
    app = make_app(world=faulty)

    @app.workflow
    async def flow() -> str:
        await sleep(0.2)
        return "woke"

    faulty.events.refuse_in_band(1, when=lambda e: e.type == "wait_completed")
    run = await app.start(flow)
    assert await run.result(timeout=15) == "woke"
    assert [e.type for e in await run.events()].count("wait_completed") == 1
    refused = [
        a for a in faulty.queue.orchestrator_answers() if a.result == messages.Redeliver(1.0)
    ]
    assert len(refused) == 1


async def test_an_early_final_timer_re_arms_its_wait(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """C6: a wait's final timer arrives before the wait is due: the delivery re-arms it under
    a key of that early message and its next attempt, and the wait completes on time, not
    early. The wait is 4 s long so the early message is handled well before it is due even
    on a loaded machine (CI once handled it after a 1 s wait was due: nothing to re-arm)."""
    app = make_app(world=faulty)

    @app.workflow
    async def flow() -> str:
        await sleep(4.0)
        return "woke"

    run = await app.start(flow)
    deadline = time.monotonic() + 10
    while "wait_created" not in [e.type for e in await run.events()]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    created = next(e for e in await run.events() if e.type == "wait_created")
    assert isinstance(created.event, events.WaitCreated)
    resume_at = created.event.resume_at
    early = messages.OrchestratorMessage(
        run_id=run.run_id, run_spec_version=9,
        wait_continuation=messages.WaitContinuation(
            correlation_id=created.correlation_id or "", hop_at_ms=int(resume_at.timestamp() * 1000)
        ),
    )  # fmt: skip
    await faulty.queue.send(early)  # delivered now, seconds before its wait is due
    assert await run.result(timeout=20) == "woke"
    completed = next(e for e in await run.events() if e.type == "wait_completed")
    assert completed.created_at >= resume_at  # on time, not early
    # Each delivery of the early message that came before the wait was due (one, unless
    # the run was busy and it was redelivered) re-arms under its own message id and the
    # attempt after its own; the queue's duplicate window never sees the message in hand.
    handled = [s.meta for s in faulty.queue.started if s.message == early]
    assert handled, "the early message was never delivered"
    keys = {timers.rearm_suffix(m.message_id, m.attempt + 1) for m in handled}
    rearmed = [s for s in faulty.queue.timers() if s.key and s.key.endswith(tuple(keys))]
    assert len(rearmed) == 1
