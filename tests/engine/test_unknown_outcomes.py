"""Regression tests of writes with an unknown outcome (seed 003 "Unknown outcome").

A transport or storage error may come after the World committed the write. No step
is then failed as ``StepAttemptsExhausted`` unless its body ran, and a
``max_retries=0`` body runs once (the simulation's ``exhausted_unrun`` invariant;
seeds 8, 216, 232, 320, 895, 2419, 2700 and 2716 of ``treadle.testing.simulation``,
pinned in tests/testing/test_simulation.py). An in-band write's unknown outcome is
settled in place by the delivery's writer (``orchestrator.writer``: it reads the log
above the write and finds it committed, or writes it again under the fence), so the
delivery neither fails nor loses what the write carried. Each test recreates its
timeline on both Worlds (local, and Postgres + NATS) with
``faults.FaultyWorld.fail_after_writes`` or ``fail_writes`` and waits on the run's
result and on the orchestrator's answers.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from treadle import errors
from treadle.world import events

from .conftest import MakeApp
from .faults import FaultyWorld


def _exhausted(log: list[events.LoggedEvent]) -> list[str]:
    return [
        e.event.step_name
        for e in log
        if isinstance(e.event, events.StepFailed) and e.event.error.type == "StepAttemptsExhausted"
    ]


def _outcomes(log: list[events.LoggedEvent]) -> Counter[str]:
    return Counter(
        e.event.step_name
        for e in log
        if isinstance(e.event, events.StepCompleted | events.StepFailed)
    )


async def test_an_inline_start_whose_batch_committed_before_its_write_failed_runs_its_body(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Simulation seeds 232 and 216: transfer (max_retries=0, inline) and other
    (background) are created in one batch; the batch commits and its write then
    raises. The delivery reloads in place, finds transfer's start committed, runs its
    body once and sends other's message: the run completes, nothing fails unrun."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=1)
    ran: Counter[str] = Counter()

    @app.step(max_retries=0)
    async def transfer() -> str:
        ran["transfer"] += 1
        return "moved"

    @app.step(max_retries=0)
    async def other() -> str:
        ran["other"] += 1
        return "other"

    @app.workflow
    async def flow() -> list[str]:
        return list(await asyncio.gather(transfer(), other()))

    faulty.events.fail_after_writes(
        1, when=lambda e: isinstance(e, events.StepStarted) and e.inline
    )
    run = await app.start(flow)
    assert await run.result(timeout=30) == ["moved", "other"]
    assert faulty.events.failures_after[0].times == 0, "the batch's write failed after it committed"
    assert ran == Counter({"transfer": 1, "other": 1})
    log = await run.events()
    assert _exhausted(log) == []
    assert _outcomes(log) == Counter({"transfer": 1, "other": 1})
    assert [e.event.type for e in log].count("step_created") == 1, "no creation is written twice"


@pytest.mark.parametrize(
    "failed_reads", [0, 1], ids=["seed 8", "seed 318: the first read back fails too"]
)
async def test_a_background_start_that_committed_before_its_write_failed_runs_its_body(
    make_app: MakeApp, faulty: FaultyWorld, failed_reads: int
) -> None:
    """Simulation seed 8: a background max_retries=0 step's ``step_started`` commits and
    its write then raises. The step's delivery finds its start in the log and runs the
    body, once; the redelivery does not fail the step as exhausted unrun. Soak seed 318:
    the delivery's first read of the step's log fails too; the read is tried again while
    the delivery holds its lease."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=0)
    ran: Counter[str] = Counter()

    @app.step(max_retries=0)
    async def transfer() -> str:
        ran["transfer"] += 1
        return "moved"

    @app.workflow
    async def flow() -> str:
        return await transfer()

    faulty.events.fail_after_writes(
        1,
        when=lambda e: isinstance(e, events.StepStarted) and not e.inline,
        then_reads=failed_reads,
    )
    run = await app.start(flow)
    assert await run.result(timeout=30) == "moved"
    assert faulty.events.failures_after[0].times == 0, "the start's write failed after it committed"
    assert faulty.events.entity_reads_failed == failed_reads
    assert ran == Counter({"transfer": 1})
    log = await run.events()
    assert _exhausted(log) == []
    assert [e.event.type for e in log if e.event.correlation_id and "step" in e.event.type] == [
        "step_created",
        "step_started",
        "step_completed",
    ]


async def test_a_background_outcome_whose_write_failed_is_written_again(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Simulation seed 320: a background step's last allowed attempt returns and its
    ``step_completed`` write fails (nothing committed). The outcome is written again,
    not lost: the step completes, its body ran once, and it is not failed as
    StepAttemptsExhausted by the redelivery."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=0)
    ran: Counter[str] = Counter()

    @app.step(max_retries=0)
    async def transfer() -> str:
        ran["transfer"] += 1
        return "moved"

    @app.workflow
    async def flow() -> str:
        return await transfer()

    faulty.events.fail_writes(1, when=lambda e: isinstance(e, events.StepCompleted))
    run = await app.start(flow)
    assert await run.result(timeout=30) == "moved"
    assert faulty.events.failures[0].times == 0, "the outcome's first write failed"
    assert ran == Counter({"transfer": 1})
    log = await run.events()
    assert _exhausted(log) == []
    assert _outcomes(log) == Counter({"transfer": 1})


async def _orchestrator_failures(faulty: FaultyWorld) -> list[str]:
    """Wait until every orchestrator delivery started so far answered; the errors they
    raised (a delivery that failed on the write's error shows here)."""
    queue = faulty.queue

    def settled() -> bool:
        started = [s for s in queue.started if s.kind == "orchestrator"]
        return bool(started) and len(queue.orchestrator_answers()) == len(started)

    await queue.until(settled)
    return [f"{a.error!r}" for a in queue.orchestrator_answers() if a.error is not None]


def _types(log: list[events.LoggedEvent]) -> list[str]:
    return [e.event.type for e in log]


@pytest.mark.parametrize("committed", [False, True], ids=["lost", "committed"])
async def test_an_inline_outcome_whose_write_had_an_unknown_outcome_is_not_lost(
    make_app: MakeApp, faulty: FaultyWorld, committed: bool
) -> None:
    """Simulation seeds 895, 2419 and 2700: an inline ``max_retries=0`` step's body
    returns and its in-band ``step_completed`` write raises a storage error, which
    committed nothing (seed 895) or came after the commit. The delivery used to fail on
    it, and its redelivery failed the step as StepAttemptsExhausted though its body had
    run and returned. Now the delivery reads the log above the write, finds it or
    writes it again, and goes on: the run completes with the step's value, its body
    ran once, one outcome, and no orchestrator delivery failed."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=4)
    ran: Counter[str] = Counter()

    @app.step(max_retries=0)
    async def transfer() -> str:
        ran["transfer"] += 1
        return "moved"

    @app.step(max_retries=3)
    async def after() -> str:
        ran["after"] += 1
        return "after"

    @app.workflow
    async def flow() -> list[str]:
        return [await transfer(), await after()]

    arm = faulty.events.fail_after_writes if committed else faulty.events.fail_writes
    arm(1, when=lambda e: isinstance(e, events.StepCompleted) and e.step_name == "transfer")
    run = await app.start(flow)
    assert await run.result(timeout=30) == ["moved", "after"]
    faults = faulty.events.failures_after if committed else faulty.events.failures
    assert faults[0].times == 0, "the outcome's write raised"
    assert ran == Counter({"transfer": 1, "after": 1})
    log = await run.events()
    assert _exhausted(log) == []
    assert _outcomes(log) == Counter({"transfer": 1, "after": 1})
    outcome = next(e for e in log if e.event.type == "step_completed")
    assert outcome.in_band, "the inline outcome is the orchestrator's own write"
    assert await _orchestrator_failures(faulty) == []


async def test_a_sibling_outcome_is_written_after_another_writes_unknown_outcome(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Simulation seed 2716: two inline bodies run in one delivery; flaky's retryable
    failure writes ``step_retrying``, which commits and then raises. The writer used to
    stop for good, so the slow ``max_retries=0`` sibling's outcome, written later, was
    refused, and the redelivery failed it as StepAttemptsExhausted though it returned.
    Now the writer finds its step_retrying committed and keeps writing: flaky's retry
    runs from its message, the sibling's outcome is written, the run completes."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=4)
    ran: Counter[str] = Counter()
    release = asyncio.Event()

    @app.step(max_retries=0)
    async def slow() -> str:
        ran["slow"] += 1
        await release.wait()  # until flaky's retry was recorded
        return "slow"

    @app.step(max_retries=2)
    async def flaky() -> str:
        ran["flaky"] += 1
        if ran["flaky"] == 1:
            raise errors.RetryableError("once", retry_after=0.05)
        return "flaky"

    @app.workflow
    async def flow() -> list[str]:
        return list(await asyncio.gather(slow(), flaky()))

    faulty.events.fail_after_writes(1, when=lambda e: isinstance(e, events.StepRetrying))
    run = await app.start(flow)

    async def retried() -> None:
        await faulty.queue.until(lambda: faulty.events.failures_after[0].times == 0)
        release.set()

    waiter = asyncio.ensure_future(retried())
    assert await run.result(timeout=30) == ["slow", "flaky"]
    await waiter
    assert ran == Counter({"slow": 1, "flaky": 2})
    log = await run.events()
    assert _exhausted(log) == []
    assert _outcomes(log) == Counter({"slow": 1, "flaky": 1})
    assert _types(log).count("step_retrying") == 1, "the retry is recorded once"
    assert await _orchestrator_failures(faulty) == []


@pytest.mark.parametrize("committed", [False, True], ids=["lost", "committed"])
async def test_a_run_completed_whose_write_had_an_unknown_outcome_ends_the_run_once(
    make_app: MakeApp, faulty: FaultyWorld, committed: bool
) -> None:
    """The terminal write's unknown outcome: ``run_completed`` raises a storage error
    (nothing committed, or after the commit). The delivery settles it in place: the
    run completes with its output, one terminal event, no delivery failed, and the
    inline step's body ran once."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=4)
    ran: Counter[str] = Counter()

    @app.step(max_retries=0)
    async def transfer() -> str:
        ran["transfer"] += 1
        return "moved"

    @app.workflow
    async def flow() -> str:
        return await transfer()

    arm = faulty.events.fail_after_writes if committed else faulty.events.fail_writes
    arm(1, when=lambda e: isinstance(e, events.RunCompleted))
    run = await app.start(flow)
    assert await run.result(timeout=30) == "moved"
    faults = faulty.events.failures_after if committed else faulty.events.failures
    assert faults[0].times == 0, "run_completed's write raised"
    assert ran == Counter({"transfer": 1})
    log = await run.events()
    assert _types(log).count("run_completed") == 1
    assert _types(log)[-1] == "run_completed"
    assert await _orchestrator_failures(faulty) == []


@pytest.mark.parametrize("committed", [False, True], ids=["lost", "committed"])
async def test_a_run_failed_whose_write_had_an_unknown_outcome_fails_the_run_once(
    make_app: MakeApp, faulty: FaultyWorld, committed: bool
) -> None:
    """``run_failed``'s unknown outcome: the workflow fails (its step's FatalError) and
    the terminal write raises a storage error. The run fails once, with the workflow's
    own error, and no delivery failed."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=4)

    @app.step(max_retries=0)
    async def refuse() -> str:
        raise errors.FatalError("no such account")

    @app.workflow
    async def flow() -> str:
        return await refuse()

    arm = faulty.events.fail_after_writes if committed else faulty.events.fail_writes
    arm(1, when=lambda e: isinstance(e, events.RunFailed))
    run = await app.start(flow)
    with pytest.raises(errors.RunFailedError, match="no such account"):
        await run.result(timeout=30)
    faults = faulty.events.failures_after if committed else faulty.events.failures
    assert faults[0].times == 0, "run_failed's write raised"
    log = await run.events()
    assert _types(log).count("run_failed") == 1
    assert await _orchestrator_failures(faulty) == []
