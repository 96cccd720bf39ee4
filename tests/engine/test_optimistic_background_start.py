"""``WORKFLOW_OPTIMISTIC_BACKGROUND_START`` (issue 15 item 2; seed 003 "Background body
before a refused start"): a background step's body runs while its ``step_started`` is
in flight, and its outcome is written only once that start committed; a refused start
discards it. Turbo's early inline bodies are test_optimistic_starts.py.

Both real Worlds, through ``FaultyWorld``; the start write is held by a gate
(``optimistic.hold_writes``) until the body says it runs, so a body that waited for
its start would never run and the test fails.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from treadle.errors import RunCancelledError
from treadle.world import events, messages

from .audit import assert_sound, types
from .conftest import MakeApp
from .faults import FaultyWorld
from .optimistic import (
    TURBO_ONLY,
    hold_writes,
    own_start_in_log,
)

# -- WORKFLOW_OPTIMISTIC_BACKGROUND_START ------------------------------------------------


def _is_background_start(name: str) -> Callable[[events.Event], bool]:
    return lambda e: isinstance(e, events.StepStarted) and e.step_name == name and not e.inline


async def test_background_optimistic_start_runs_the_body_while_its_start_is_in_flight(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 003 ``WORKFLOW_OPTIMISTIC_BACKGROUND_START=1``: a background step's first
    delivery starts the body while its step_started (held at the World until the body
    runs) is in flight; the outcome is written after the start."""
    gate = hold_writes(faulty, _is_background_start("work"))
    app = make_app(
        world=faulty,
        **TURBO_ONLY,
        WORKFLOW_MAX_INLINE_STEPS=0,
        WORKFLOW_OPTIMISTIC_BACKGROUND_START="1",
    )
    own: dict[str, bool] = {}

    @app.step
    async def work() -> str:
        own["work"] = await own_start_in_log(faulty, "work")
        gate.release.set()
        return "w"

    @app.workflow
    async def flow() -> str:
        return await work()

    run = await app.start(flow)
    assert await run.result(timeout=30) == "w"
    assert gate.timed_out == [], "the body waited for its start"
    assert own == {"work": False}
    kinds = types(await assert_sound(run))
    assert kinds.index("step_started") < kinds.index("step_completed")


@pytest.mark.parametrize("case", ["default", "max_retries=0", "inline-start=0"])
async def test_background_body_waits_for_its_start(
    make_app: MakeApp, faulty: FaultyWorld, case: str
) -> None:
    """By default (the setting is an opt-in), for a ``max_retries=0`` step under the
    opt-in, and under the opt-in with ``WORKFLOW_OPTIMISTIC_INLINE_START=0`` (which wins),
    a background body starts only once its step_started committed: it finds it in the
    log."""
    overrides: dict[str, Any] = {"WORKFLOW_MAX_INLINE_STEPS": 0}
    if case != "default":
        overrides["WORKFLOW_OPTIMISTIC_BACKGROUND_START"] = "true"
    if case == "inline-start=0":
        overrides["WORKFLOW_OPTIMISTIC_INLINE_START"] = "0"
    app = make_app(world=faulty, **TURBO_ONLY, **overrides)
    own: dict[str, bool] = {}

    @app.step(max_retries=0 if case == "max_retries=0" else 3)
    async def work() -> str:
        own["work"] = await own_start_in_log(faulty, "work")
        return "w"

    @app.workflow
    async def flow() -> str:
        return await work()

    run = await app.start(flow)
    assert await run.result(timeout=30) == "w"
    assert own == {"work": True}
    await assert_sound(run)


@pytest.mark.parametrize("optimistic", [True, False])
async def test_background_body_before_a_start_refused_as_the_run_ended(
    make_app: MakeApp, faulty: FaultyWorld, optimistic: bool
) -> None:
    """Seed 003 "Background body before a refused start": the step's delivery read the
    log (the run was running) and its step_started is held at the World while the run
    is cancelled. Under the opt-in the body runs before the refused start arrives, its
    outcome is discarded, and the delivery acks; by default the refused start comes
    first and no body runs. Nothing of the step after its creation is written either
    way. (A cancel before the delivery's log read runs no body in either mode: the
    handler reads the log first.)"""
    overrides: dict[str, Any] = {"WORKFLOW_MAX_INLINE_STEPS": 0}
    if optimistic:
        overrides["WORKFLOW_OPTIMISTIC_BACKGROUND_START"] = "1"
    app = make_app(world=faulty, **TURBO_ONLY, **overrides)
    ran: Counter[str] = Counter()

    @app.step
    async def work() -> str:
        ran["work"] += 1
        return "w"

    @app.workflow
    async def flow() -> str:
        return await work()

    gate = hold_writes(faulty, _is_background_start("work"))
    run = await app.start(flow)
    await faulty.queue.until(lambda: bool(gate.held))
    await run.cancel()
    gate.release.set()
    await faulty.queue.until(lambda: any(a.kind == "step" for a in faulty.queue.answers))
    (answer,) = [a for a in faulty.queue.answers if a.kind == "step"]
    assert answer.error is None and answer.result == messages.ACK
    with pytest.raises(RunCancelledError):
        await run.result(timeout=10)
    kinds = types(await assert_sound(run))
    assert "step_started" not in kinds and "step_completed" not in kinds
    assert ran == (Counter(work=1) if optimistic else Counter())


async def test_background_body_before_a_throttled_start_runs_again_with_one_outcome(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 003 "Background body before a refused start", the throttled branch: under
    the opt-in the start fails (a storage error, not in the log), so the body's outcome
    is discarded and the message is redelivered; the redelivery (count 2) awaits its
    start and runs the body again. Two runs of the body, one start, one outcome."""
    app = make_app(
        world=faulty,
        **TURBO_ONLY,
        WORKFLOW_MAX_INLINE_STEPS=0,
        WORKFLOW_OPTIMISTIC_BACKGROUND_START="1",
    )
    ran: Counter[str] = Counter()

    @app.step
    async def work() -> str:
        ran["work"] += 1
        return "w"

    @app.workflow
    async def flow() -> str:
        return await work()

    faulty.events.fail_writes(1, when=_is_background_start("work"))
    run = await app.start(flow)
    assert await run.result(timeout=30) == "w"
    steps = [a for a in faulty.queue.answers if a.kind == "step"]
    assert steps[0].error is not None and steps[0].meta.delivery_count == 1
    assert ran == Counter(work=2)
    kinds = types(await assert_sound(run))
    assert kinds.count("step_started") == 1 and kinds.count("step_completed") == 1
