"""Whole runs on the local World: the happy paths and what each leaves in the log."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from treadle import FatalError, RetryableError, StepFailed, sleep, step_metadata
from treadle.errors import RunFailedError

from .conftest import BOTH_FORMATS, MakeApp

# Spec 9 on both Worlds and spec 8 on the local one.
pytestmark = BOTH_FORMATS


async def test_sequential_steps_and_a_sleep_leave_the_expected_log(
    make_app: MakeApp, spec_version: int
) -> None:
    """Inline steps are created by their first step_started; a sleep is a wait pair. Spec 9
    writes in-band; spec 8 writes every event after run_created out-of-band and stamps an
    inline start with its owner message (seed 000)."""
    app = make_app()

    @app.step
    async def double(n: int) -> int:
        return n * 2

    @app.workflow
    async def flow(n: int) -> int:
        a = await double(n)
        await sleep(0.2)
        return await double(a)

    run = await app.start(flow, 3)
    assert await run.result(timeout=10) == 12
    log = await run.events()
    assert [e.type for e in log] == [
        "run_created", "run_started", "step_started", "step_completed", "wait_created",
        "wait_completed", "step_started", "step_completed", "run_completed",
    ]  # fmt: skip
    if spec_version == 9:
        assert all(e.in_band for e in log)
    else:
        assert not any(e.in_band for e in log[1:])
    first_start = log[2].event
    assert first_start.type == "step_started" and first_start.inline and first_start.input
    assert (first_start.owner_message_id is not None) == (spec_version == 8)


async def test_fan_out_runs_three_inline_and_the_rest_in_the_background(make_app: MakeApp) -> None:
    """A gather of 40 steps: WORKFLOW_MAX_INLINE_STEPS inline, the rest from their messages."""
    app = make_app()
    ran: Counter[int] = Counter()

    @app.step
    async def work(i: int) -> int:
        ran[i] += 1
        return i

    @app.workflow
    async def fan(n: int) -> int:
        return sum(await asyncio.gather(*(work(i) for i in range(n))))

    run = await app.start(fan, 40)
    assert await run.result(timeout=20) == sum(range(40))
    assert ran == Counter({i: 1 for i in range(40)})
    log = await run.events()
    inline = [e for e in log if e.type == "step_started" and e.event.inline]
    created = [e for e in log if e.type == "step_created"]
    assert len(inline) == 3
    assert len(created) == 37
    assert all(not e.event.inline and e.event.creator_message_id for e in created)
    background_starts = [e for e in log if e.type == "step_started" and not e.event.inline]
    assert len(background_starts) == 37 and not any(e.in_band for e in background_starts)


async def test_a_failing_inline_step_retries_from_its_own_message(
    make_app: MakeApp, spec_version: int
) -> None:
    """E3: an inline step's retry is written by the delivery (in-band on spec 9) and moves
    to the step's own message."""
    app = make_app()
    attempts: list[int] = []

    @app.step(max_retries=3)
    async def flaky() -> str:
        attempts.append(step_metadata().attempt)
        if len(attempts) < 3:
            raise RetryableError("try again", retry_after=0.1)
        return "done"

    @app.workflow
    async def flow() -> str:
        return await flaky()

    run = await app.start(flow)
    assert await run.result(timeout=10) == "done"
    assert attempts == [1, 2, 3]
    log = await run.events()
    retrying = [e for e in log if e.type == "step_retrying"]
    assert retrying[0].in_band == (spec_version == 9) and retrying[0].event.creator_message_id
    assert not retrying[1].in_band, "the second retry is the step message's own, in place"
    starts = [e for e in log if e.type == "step_started"]
    assert [s.event.inline for s in starts] == [True, False, False]
    assert [s.event.attempt for s in starts] == [1, 2, 3]


async def test_fatal_error_fails_the_step_at_once_and_the_workflow_can_catch_it(
    make_app: MakeApp,
) -> None:
    """FatalError skips retries; the workflow sees StepFailed and carries on."""
    app = make_app()
    attempts = 0

    @app.step(max_retries=5)
    async def doomed() -> None:
        nonlocal attempts
        attempts += 1
        raise FatalError("card declined")

    @app.workflow
    async def flow() -> str:
        try:
            await doomed()
        except StepFailed as exc:
            return f"caught {exc.error_type}: {exc.error_message}"
        return "not reached"

    run = await app.start(flow)
    assert await run.result(timeout=10) == "caught FatalError: card declined"
    assert attempts == 1


async def test_retries_run_out_and_the_run_fails_with_the_step_error(make_app: MakeApp) -> None:
    """max_retries=1: two attempts, then the step fails and so does the workflow."""
    app = make_app()
    attempts = 0

    @app.step(max_retries=1)
    async def always_broken() -> None:
        nonlocal attempts
        attempts += 1
        raise ValueError(f"broken {attempts}")

    @app.workflow
    async def flow() -> None:
        await always_broken()

    run = await app.start(flow)
    with pytest.raises(RunFailedError, match="broken 2"):
        await run.result(timeout=10)
    assert attempts == 2


async def test_sync_steps_run_in_a_thread_with_their_metadata(make_app: MakeApp) -> None:
    """A plain def step runs off the event loop and still sees step_metadata()."""
    app = make_app()

    @app.step
    def blocking(x: int) -> str:
        meta = step_metadata()
        return f"{x}:{meta.step_name}:{meta.attempt}"

    @app.workflow
    async def flow() -> str:
        return await blocking(7)

    run = await app.start(flow)
    assert await run.result(timeout=10) == "7:blocking:1"


async def test_a_workflow_exception_fails_the_run(make_app: MakeApp) -> None:
    """An exception out of the workflow is run_failed with its type and message."""
    app = make_app()

    @app.workflow
    async def flow() -> None:
        raise KeyError("missing")

    run = await app.start(flow)
    with pytest.raises(RunFailedError, match="KeyError"):
        await run.result(timeout=10)
    assert (await run.get()).error.type == "KeyError"
