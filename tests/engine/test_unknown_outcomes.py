"""Regression tests of writes with an unknown outcome (seed 003 "Unknown outcome").

A transport or storage error may come after the World committed the write. No step
is then failed as ``StepAttemptsExhausted`` unless its body ran, and a
``max_retries=0`` body runs once (the simulation's ``exhausted_unrun`` invariant;
seeds 8, 216, 232 and 320 of ``treadle.testing.simulation``, pinned in
tests/testing/test_simulation.py). Each test recreates its timeline on both Worlds
(local, and Postgres + NATS) with ``faults.FaultyWorld.fail_after_writes`` or
``fail_writes`` and waits on the run's result.
"""

from __future__ import annotations

import asyncio
from collections import Counter

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


async def test_a_background_start_that_committed_before_its_write_failed_runs_its_body(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Simulation seed 8: a background max_retries=0 step's ``step_started`` commits and
    its write then raises. The step's delivery finds its start in the log and runs the
    body, once; the redelivery does not fail the step as exhausted unrun."""
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
        1, when=lambda e: isinstance(e, events.StepStarted) and not e.inline
    )
    run = await app.start(flow)
    assert await run.result(timeout=30) == "moved"
    assert faulty.events.failures_after[0].times == 0, "the start's write failed after it committed"
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
