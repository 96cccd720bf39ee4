"""Seed 003's edge cases that one process can show, each named after its section.

A fault-injecting World (``faults.FaultyWorld``, a wrapper over the real local
World) refuses writes or fails sends where the case needs it; every test
asserts that the run completes and each step body ran as the model promises.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from treadle import StepFailed, sleep
from treadle.errors import RunFailedError
from treadle.world import messages

from .conftest import MakeApp
from .faults import FaultyWorld


@pytest.mark.parametrize("optimistic", ["default", "0"])
async def test_self_superseded_refusal_redelivers_and_completes(
    make_app: MakeApp, faulty: FaultyWorld, optimistic: str
) -> None:
    """Self-superseded 412 (A2, once): the refused delivery answers Redeliver(1), never Ack;
    its redelivery reloads the log and completes the run. The refused write is the start
    batch of turbo's first boundary: with ``WORKFLOW_OPTIMISTIC_INLINE_START=0`` the body
    waited for it and runs once; by default it started before it (docs/turbo.md), its
    outcome was discarded, and the redelivery runs it again: twice, one outcome."""
    # Run-ahead (branch ra) off: it starts a body before its start too.
    tuned: dict[str, Any] = {"WORKFLOW_RUN_AHEAD_DEPTH": 0}
    if optimistic != "default":
        tuned["WORKFLOW_OPTIMISTIC_INLINE_START"] = optimistic
    app = make_app(world=faulty, **tuned)
    ran: Counter[str] = Counter()

    @app.step
    async def work() -> str:
        ran["work"] += 1
        return "ok"

    @app.workflow
    async def flow() -> str:
        return await work()

    faulty.events.refuse_in_band(1, when=lambda e: e.type == "step_started")
    run = await app.start(flow)
    assert await run.result(timeout=15) == "ok"
    answers = faulty.queue.orchestrator_answers()
    assert isinstance(answers[0].result, messages.Redeliver) and answers[0].result.seconds == 1
    assert answers[1].meta.message_id == answers[0].meta.message_id
    assert answers[1].meta.delivery_count == 2 and answers[1].result == messages.ACK
    assert ran == Counter({"work": 1 if optimistic == "0" else 2})
    kinds = [e.type for e in await run.events()]
    assert kinds.count("step_started") == 1 and kinds.count("step_completed") == 1


async def test_refused_on_every_pass_fails_at_the_delivery_cap(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """A2, always: each refusal is a counted redelivery, so the cap fails the run."""
    app = make_app(world=faulty, WORKFLOW_MAX_QUEUE_DELIVERIES=3)

    @app.workflow
    async def flow() -> str:
        await sleep(0.1)
        return "never"

    faulty.events.refuse_in_band(-1, when=lambda e: e.type != "run_failed")
    run = await app.start(flow)
    with pytest.raises(RunFailedError, match=r"MAX_DELIVERIES_EXCEEDED|delivered 4 times"):
        await run.result(timeout=20)
    answers = faulty.queue.orchestrator_answers()
    assert [a.meta.attempt for a in answers] == [1, 2, 3, 4]
    assert all(isinstance(a.result, messages.Redeliver) for a in answers[:3])
    assert answers[3].result == messages.ACK


async def test_crash_between_commit_and_dispatch_resends_the_step(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """B1: step_created commits, its message's send fails; the redelivery (counted above 1)
    re-sends it under its stable key, and the step runs once."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=0)
    ran: Counter[str] = Counter()

    @app.step
    async def work(i: int) -> int:
        ran[f"work{i}"] += 1
        return i

    @app.workflow
    async def flow() -> int:
        return sum(await asyncio.gather(work(1), work(2)))

    faulty.queue.fail_sends(1, when=lambda s: s.message.kind == "step")
    run = await app.start(flow)
    assert await run.result(timeout=15) == 3
    assert ran == Counter({"work1": 1, "work2": 1})
    resent = [s for s in faulty.queue.sent if s.message.kind == "step" and s.message.step_resent]
    assert len(resent) == 2, "the redelivery re-sent both unstarted steps"
    created = [e.correlation_id for e in await run.events() if e.type == "step_created"]
    assert sorted(s.key or "" for s in resent) == sorted(
        f"step:{run.run_id}:{c}" for c in created
    ), "each step re-sent once, under its stable key"


async def test_lost_completion_wake_is_sent_again_by_the_step_redelivery(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit B4: the step's outcome commits, its wake fails; the step message comes back,
    finds the step terminal, sends the wake itself and acks without running the body."""
    # No linger: the orchestrator acks and waits for the wake, which is what is lost.
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=0, WORKFLOW_ORCHESTRATOR_LINGER_MS=0)
    ran: Counter[str] = Counter()

    @app.step
    async def work() -> str:
        # The orchestrator has acked (waiting for this wake) before the outcome commits.
        await faulty.queue.until(lambda: bool(faulty.queue.orchestrator_answers()))
        ran["work"] += 1
        return "done"

    @app.workflow
    async def flow() -> str:
        return await work()

    def first_wake_after_step(send: messages.Send) -> bool:
        return send.message.kind == "orchestrator" and ran["work"] == 1

    faulty.queue.fail_sends(1, when=first_wake_after_step)
    run = await app.start(flow)
    assert await run.result(timeout=15) == "done"
    assert ran == Counter({"work": 1})
    # The redelivery's wake completes the run before its own answer is recorded: wait for it.
    await faulty.queue.until(
        lambda: len([a for a in faulty.queue.answers if a.kind == "step"]) >= 2
    )
    step_answers = [a for a in faulty.queue.answers if a.kind == "step"]
    assert step_answers[0].error is not None
    assert step_answers[1].meta.delivery_count == 2 and step_answers[1].result == messages.ACK
    # The wake that completed the run was sent by the step's redelivery, not found by a race.
    wakes = [t for t in faulty.trace if t.what == "send" and t.name == "orchestrator"
             and t.by is not None and t.by.meta is step_answers[1].meta]  # fmt: skip
    assert len(wakes) == 1, "the step redelivery sent the completion wake again"
    completed = next(t for t in faulty.trace if t.name == "run_completed")
    assert completed.seq > wakes[0].seq, "the run completed only after the re-sent wake"


async def test_unserializable_step_argument_fails_that_step_not_the_run(
    make_app: MakeApp,
) -> None:
    """E7: an argument that cannot be serialized gets a placeholder creation and a failure
    the workflow can catch; the run goes on."""
    app = make_app()

    @app.step
    async def takes(thing: object) -> str:
        return "ran"

    @app.workflow
    async def flow() -> str:
        try:
            await takes(object())
        except StepFailed as exc:
            return f"caught: {exc.error_type}"
        return "not reached"

    run = await app.start(flow)
    assert await run.result(timeout=10) == "caught: SerializationError"
    types = [e.type for e in await run.events()]
    assert types.count("step_created") == 1 and types.count("step_failed") == 1


async def test_large_step_input_is_read_from_its_creation_event(make_app: MakeApp) -> None:
    """E7: a 200 KiB input is over the 128 KiB message limit; the step reads it from the log."""
    app = make_app(WORKFLOW_MAX_INLINE_STEPS=0)

    @app.step
    async def measure(blob: str) -> int:
        return len(blob)

    @app.workflow
    async def flow() -> int:
        return await measure("x" * 200 * 1024)

    run = await app.start(flow)
    assert await run.result(timeout=10) == 200 * 1024


async def test_non_deterministic_call_fails_the_run_naming_it(make_app: MakeApp) -> None:
    """Workflow code that reaches for real I/O fails with NonDeterministicCall."""
    app = make_app()

    @app.workflow
    async def flow() -> None:
        await asyncio.get_running_loop().run_in_executor(None, print, "no")

    run = await app.start(flow)
    with pytest.raises(RunFailedError, match="NonDeterministicCall"):
        await run.result(timeout=10)


async def test_completion_wakes_coalesce_into_the_running_delivery(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit F1 / seed 003 "Uncoalesced wakes": 30 background completions wake the run far
    fewer than 30 times; re-runs count up with attempt 1; the workflow is replayed at most
    once per delivery that had something new, and a re-run finding nothing new after its
    tail read acks without a replay (here: a wake after the run ended)."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=0)
    replays: list[int] = []

    @app.step
    async def work(i: int) -> int:
        await asyncio.sleep(0.01 * (i % 5))
        return i

    @app.workflow
    async def flow() -> int:
        replays.append(1)
        return sum(await asyncio.gather(*(work(i) for i in range(30))))

    run = await app.start(flow)
    assert await run.result(timeout=20) == sum(range(30))
    answers = faulty.queue.orchestrator_answers()
    deliveries = {a.meta.invocation_started_at for a in answers}
    assert len(deliveries) < 15
    reruns = [a.meta for a in answers if a.meta.rerun > 0]
    assert all(m.delivery_count > 1 and m.attempt == 1 for m in reruns)
    # One replay per pass at most: never more replays than orchestrator handler calls.
    assert len(replays) <= len(answers), f"{len(replays)} replays for {len(answers)} calls"
    # After the run ended, a wake with nothing new acks after its tail read, replaying nothing.
    before, answered = len(replays), len(answers)
    record = await run.get()
    await faulty.queue.send(
        messages.OrchestratorMessage(run_id=run.run_id, run_spec_version=record.spec_version)
    )
    await faulty.queue.until(lambda: len(faulty.queue.orchestrator_answers()) > answered)
    assert faulty.queue.orchestrator_answers()[-1].result == messages.ACK
    assert len(replays) == before
