"""Run timeouts, step timeouts, heartbeats and timeout blocks in workflows (issue 17 item
5; docs/timeouts.md), on both real Worlds (local, and Postgres + NATS).

Timeouts here are short, but each test asserts on what the log records (the run
timeout's wait at position -1, ``step_retrying`` with ``StepTimedOut``, the attempt
numbers, the outcome that stands), never on how long anything took; the tests wait
on logged events, never a fixed sleep. Each finished run's log is replayed cold and
must end the same way (``_replays_to``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import treadle
from treadle import StepFailed, runtimeouts, sleep, step_heartbeat, step_metadata
from treadle.client import start_run
from treadle.errors import FeatureNeedsSpec9, RunFailedError
from treadle.replay import engine
from treadle.sdk import functions
from treadle.world import events, ids

from .conftest import MakeApp

WAIT = 20.0


async def _until(run: Any, check: Any, what: str) -> list[events.LoggedEvent]:
    """The run's log once ``check(log)`` holds (polling the World's view of the run)."""
    deadline = time.monotonic() + WAIT
    while True:
        log = await run.events()
        if check(log):
            return list(log)
        assert time.monotonic() < deadline, f"never saw {what}: {[e.type for e in log]}"
        await asyncio.sleep(0.02)  # another task's progress, seen through the World


def _of(log: list[events.LoggedEvent], type_: str) -> list[Any]:
    return [e.event for e in log if e.type == type_]


def _replays_to(app: Any, log: list[events.LoggedEvent]) -> engine.Outcome:
    """A finished run's log replayed cold: the outcome its code decides from the log."""
    created = log[0].event
    assert isinstance(created, events.RunCreated)
    workflow = app.get_workflow(created.workflow_name)
    args, kwargs = functions.decode_arguments(created.input)
    replay = engine.Replay(
        run_id=log[0].run_id,
        workflow_name=created.workflow_name,
        workflow=workflow.fn,
        args=args,
        kwargs=kwargs,
        created_at=log[0].created_at,
        run_timeout=runtimeouts.recorded(created.input),
    )
    try:
        for logged in log:
            replay.feed(logged)
        return replay.advance()
    finally:
        replay.close()


# -- run timeouts ------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["start", "decorator"])
async def test_a_run_past_its_run_timeout_fails_with_run_timed_out(
    make_app: MakeApp, where: str
) -> None:
    app = make_app()
    release = asyncio.Event()

    @app.step
    async def slow() -> str:
        await release.wait()
        return "late"

    @app.workflow(timeout="0.4s" if where == "decorator" else None)
    async def bounded() -> str:
        return await slow()

    run = await (app.start(bounded) if where == "decorator" else app.start(bounded, timeout=0.4))
    with pytest.raises(RunFailedError) as failed:
        await run.result(timeout=WAIT)
    assert failed.value.error_type == "RunTimedOut"
    release.set()  # the step was running: its outcome is recorded, and revives nothing
    log = await _until(run, lambda log: _of(log, "step_completed"), "the step's late outcome")
    types = [e.type for e in log]
    assert types.index("run_failed") < types.index("step_completed")
    created = log[0].event
    assert isinstance(created, events.RunCreated) and created.input["timeout_s"] == 0.4  # type: ignore[index]
    (deadline,) = [w for w in _of(log, "wait_created") if w.position == -1]
    assert deadline.resume_at.timestamp() == pytest.approx(log[0].created_at.timestamp() + 0.4)
    assert [w.correlation_id for w in _of(log, "wait_completed")] == [deadline.correlation_id]
    (failure,) = _of(log, "run_failed")
    assert failure.error.type == "RunTimedOut"
    assert not _of(log, "run_completed")
    assert (await run.get()).status == "failed"
    replayed = _replays_to(app, log)
    assert isinstance(replayed, engine.Failed)
    assert type(replayed.error).__name__ == "RunTimedOut"


async def test_a_run_that_ends_inside_its_run_timeout_completes_and_replays_the_same(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.step
    async def quick(n: int) -> int:
        return n * 2

    @app.workflow(timeout="1h")
    async def fast(n: int) -> int:
        return await quick(n) + await quick(n + 1)

    run = await app.start(fast, 3, timeout="2h")  # the start's own wins over the decorator's
    assert await run.result(timeout=WAIT) == 14
    log = await run.events()
    assert log[0].event.input["timeout_s"] == 7200.0  # type: ignore[union-attr]
    assert [w.position for w in _of(log, "wait_created")] == [-1]
    assert not _of(log, "wait_completed")
    assert [s.position for s in _of(log, "step_started")] == [0, 1]  # positions unshifted
    assert _replays_to(app, log) == engine.Completed(14)


# -- step timeouts -----------------------------------------------------------------------


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "background"])
async def test_a_step_past_its_timeout_is_retried_then_failed(
    make_app: MakeApp, inline: bool
) -> None:
    app = make_app(WORKFLOW_MAX_INLINE_STEPS=3 if inline else 0)
    attempts: list[int] = []

    @app.step(timeout="0.3s", max_retries=1)
    async def stuck() -> str:
        attempts.append(step_metadata().attempt)
        await asyncio.Event().wait()  # never set: only the timeout ends it
        return "never"

    @app.workflow
    async def flow() -> str:
        try:
            return await stuck()
        except StepFailed as exc:
            return f"failed: {exc.error_type}"

    run = await app.start(flow)
    assert await run.result(timeout=WAIT) == "failed: StepTimedOut"
    log = await run.events()
    assert [e.attempt for e in _of(log, "step_started")] == [1, 2]
    (retry,) = _of(log, "step_retrying")
    assert (retry.attempt, retry.error.type) == (1, "StepTimedOut")
    assert "timeout of 0.3 s" in retry.error.message
    (failed,) = _of(log, "step_failed")
    assert (failed.attempt, failed.error.type) == (2, "StepTimedOut")
    assert not _of(log, "step_completed")
    assert attempts == [1, 2]
    assert _replays_to(app, log) == engine.Completed("failed: StepTimedOut")


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "background"])
async def test_a_sync_body_returning_after_its_timeout_has_its_outcome_refused(
    make_app: MakeApp, inline: bool
) -> None:
    """A thread cannot be killed: attempt 1 returns "late" after its deadline (the test
    lets it go only once the attempt's timeout is logged); that return is never written,
    and attempt 2's result is the step's."""
    app = make_app(WORKFLOW_MAX_INLINE_STEPS=3 if inline else 0)
    gate = threading.Event()
    returned: list[str] = []

    @app.step(timeout="0.3s", max_retries=2)
    def blocking() -> str:
        attempt = step_metadata().attempt
        if attempt == 1:
            gate.wait(WAIT)  # held past the deadline
            returned.append("late")
            return "late"
        return f"on time {attempt}"

    @app.workflow
    async def flow() -> str:
        return await blocking()

    run = await app.start(flow)
    await _until(run, lambda log: _of(log, "step_retrying"), "the attempt's timeout")
    gate.set()
    assert await run.result(timeout=WAIT) == "on time 2"
    log = await run.events()
    (retry,) = _of(log, "step_retrying")
    assert (retry.attempt, retry.error.type) == (1, "StepTimedOut")
    assert [c.result for c in _of(log, "step_completed")] == ["on time 2"]
    deadline = time.monotonic() + WAIT
    while not returned:  # the abandoned thread did return, later, and was ignored
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)  # another thread's progress
    assert [c.result for c in _of(await run.events(), "step_completed")] == ["on time 2"]


# -- heartbeats --------------------------------------------------------------------------


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "background"])
async def test_a_heartbeat_lapse_is_retried_and_the_next_attempt_sees_the_last_details(
    make_app: MakeApp, inline: bool
) -> None:
    app = make_app(WORKFLOW_MAX_INLINE_STEPS=3 if inline else 0)
    seen: list[Any] = []

    @app.step(heartbeat_timeout="0.5s", max_retries=2)
    async def crawl(pages: int) -> dict[str, int]:
        meta = step_metadata()
        seen.append(meta.heartbeat_details)
        start = (meta.heartbeat_details or {"done": 0})["done"]
        for page in range(start + 1, pages + 1):
            step_heartbeat({"done": page})
            if meta.attempt == 1 and page == 3:
                await asyncio.Event().wait()  # stops beating: the lapse ends it
        return {"done": pages, "resumed_from": start}

    @app.workflow
    async def flow() -> dict[str, int]:
        return await crawl(5)

    run = await app.start(flow)
    assert await run.result(timeout=WAIT) == {"done": 5, "resumed_from": 3}
    assert seen == [None, {"done": 3}]
    log = await run.events()
    (retry,) = _of(log, "step_retrying")
    assert (retry.attempt, retry.error.type) == (1, "StepTimedOut")
    assert "heartbeat_timeout of 0.5 s" in retry.error.message
    assert [e.attempt for e in _of(log, "step_started")] == [1, 2]
    # Heartbeats are not log events: the log holds the step's events and nothing per beat.
    assert {e.type for e in log} <= {
        "run_created", "run_started", "step_created", "step_started", "step_retrying",
        "step_completed", "run_completed",
    }  # fmt: skip


async def test_a_step_that_keeps_beating_runs_past_its_heartbeat_timeout(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.step(heartbeat_timeout="0.3s", max_retries=0)
    async def long(n: int) -> int:
        for i in range(n):
            step_heartbeat(i)
            await asyncio.sleep(0.1)  # the body's own work, beating as it goes
        return n

    @app.workflow
    async def flow() -> int:
        return await long(12)  # 1.2 s in all: four heartbeat timeouts

    run = await app.start(flow)
    assert await run.result(timeout=WAIT) == 12
    assert not _of(await run.events(), "step_retrying")


# -- timeouts inside a workflow ----------------------------------------------------------


@pytest.mark.parametrize("form", ["treadle.timeout", "asyncio.timeout", "asyncio.wait_for"])
async def test_a_timeout_block_in_a_workflow_is_a_durable_wait_and_replays_the_same(
    make_app: MakeApp, form: str
) -> None:
    """The block's deadline is a wait in the log; it times out where its wait_completed
    is, before the step's outcome, and the step's later result is ignored, the same on
    a cold replay of the finished log."""
    app = make_app()
    release = asyncio.Event()

    @app.step
    async def slow() -> str:
        await release.wait()
        return "slow"

    @app.step
    async def fallback() -> str:
        return "fallback"

    def block() -> asyncio.Timeout:
        return treadle.timeout("0.3s") if form == "treadle.timeout" else asyncio.timeout(0.3)

    @app.workflow
    async def flow() -> str:
        try:
            if form == "asyncio.wait_for":
                return await asyncio.wait_for(slow(), 0.3)
            async with block():
                return await slow()
        except TimeoutError:
            return await fallback()

    run = await app.start(flow)
    await _until(run, lambda log: _of(log, "wait_completed"), "the block's wait_completed")
    release.set()
    assert await run.result(timeout=WAIT) == "fallback"
    log = await run.events()
    (wait,) = _of(log, "wait_created")
    # wait_for's step is called first (position 0); a block's timer is armed at its entry.
    assert wait.position == (1 if form == "asyncio.wait_for" else 0)
    names = [(e.type, getattr(e.event, "step_name", None)) for e in log]
    assert names.index(("wait_completed", None)) < names.index(("step_started", "fallback"))
    assert _replays_to(app, log) == engine.Completed("fallback")


async def test_a_cancelled_task_in_a_workflow_is_replayed_the_same(make_app: MakeApp) -> None:
    """Cancelling a task that awaits a step: the step's result is ignored, and the
    replay takes the same path (the cancel happens where the code does it)."""
    app = make_app()
    release = asyncio.Event()

    @app.step
    async def work(n: int) -> int:
        if n == 1:
            await release.wait()  # held until the sleep beside it completed
        return n

    @app.workflow
    async def flow() -> str:
        task = asyncio.ensure_future(work(1))
        await sleep(0.2)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return f"cancelled, then {await work(2)}"
        return f"finished first, then {await work(2)}"

    run = await app.start(flow)
    await _until(run, lambda log: _of(log, "wait_completed"), "the sleep's wait_completed")
    release.set()
    assert await run.result(timeout=WAIT) == "cancelled, then 2"
    log = await run.events()
    # work(1)'s body runs to its end once released and its result is ignored by the
    # workflow: recorded if it lands before the run completes, refused after (a full run
    # under load saw the run end first).
    results = sorted(c.result for c in _of(log, "step_completed"))
    assert results in ([1, 2], [2]), results
    assert _replays_to(app, log) == engine.Completed("cancelled, then 2")


# -- bad input and spec 8 ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"timeout": 0}, "timeout must be a positive duration"),
        ({"timeout": "soon"}, "is not a duration"),
        ({"timeout": -1}, "non-negative"),
        ({"heartbeat_timeout": "0s"}, "heartbeat_timeout must be a positive duration"),
    ],
)
async def test_a_bad_step_timeout_is_refused_at_decoration(
    make_app: MakeApp, kwargs: dict[str, Any], named: str
) -> None:
    app = make_app()
    with pytest.raises(ValueError, match=named) as refused:

        @app.step(**kwargs)
        async def s() -> None: ...

    assert "step s:" in str(refused.value)
    with pytest.raises(ValueError, match="workflow w: timeout"):

        @app.workflow(timeout="-5m")
        async def w() -> None: ...


async def test_a_bad_start_timeout_is_refused_and_nothing_recorded(make_app: MakeApp) -> None:
    app = make_app()

    @app.workflow
    async def w() -> None: ...

    for bad in (0, "0s", "later", -3):
        with pytest.raises(ValueError, match="workflow w: start timeout"):
            await app.start(w, timeout=bad)
    with pytest.raises(ValueError, match="timeout must be a positive duration"):
        treadle.timeout(0)
    world = await app.world()
    assert await world.runs.count() == 0


@pytest.mark.parametrize("open_world", ["local-spec8", "postgres+nats-spec8"], indirect=True)
async def test_spec8_refuses_a_run_timeout_and_keeps_step_timeouts(make_app: MakeApp) -> None:
    """A run timeout needs spec 9's in-band wait: a clear error at the start naming the
    feature and WORKFLOW_SPEC_VERSION, nothing recorded. Step timeouts work on spec 8
    (they hold in the body's process)."""
    app = make_app()

    @app.step(timeout="0.3s", max_retries=1)
    async def stuck() -> str:
        await asyncio.Event().wait()
        return "never"

    @app.workflow
    async def flow() -> str:
        try:
            return await stuck()
        except StepFailed as exc:
            return exc.error_type

    with pytest.raises(FeatureNeedsSpec9, match=r"a run timeout.*WORKFLOW_SPEC_VERSION=9"):
        await app.start(flow, timeout="1h")
    world = await app.world()
    assert await world.runs.count() == 0
    run = await app.start(flow)
    assert (await run.get()).spec_version == 8
    assert await run.result(timeout=WAIT) == "StepTimedOut"
    log = await run.events()
    assert [(r.attempt, r.error.type) for r in _of(log, "step_retrying")] == [(1, "StepTimedOut")]
    # A spec 8 run recorded with a run timeout anyway (a foreign client): it fails, clearly.
    foreign = ids.new_run_id()
    await start_run(
        world, name="flow", data={"args": [], "kwargs": {}, "timeout_s": 60.0},
        deployment_id=app.settings.TREADLE_DEPLOYMENT_ID, spec_version=8, run_id=foreign,
    )  # fmt: skip
    with pytest.raises(RunFailedError) as failed:
        await app.get_run(foreign).result(timeout=WAIT)
    assert failed.value.error_type == "FeatureNeedsSpec9"
    assert "WORKFLOW_SPEC_VERSION" in failed.value.error_message
