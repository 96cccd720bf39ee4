"""What ``advance`` answers when the workflow ends, when the run is cancelled, and what
``close`` leaves behind; plus a guard that a step's cost does not grow with the log
(REPLAY.md, "Suspension"; engine docstring: "each fed event is indexed once")."""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from treadle import errors
from treadle.replay import engine
from treadle.sdk import hooks

from . import histories
from .histories import LiveDriver, Log

a = histories.step("a")
b = histories.step("b")
cleanup = histories.step("cleanup")


class Boom(Exception):
    pass


def test_a_returning_workflow_is_completed_with_its_value() -> None:
    """When the runner returns, the flow records run_completed (seed 004)."""

    async def wf(x: int) -> Any:
        return {"double": 2 * await a(x)}

    log = Log(args=[21])
    log.step(0, "a", 21)
    assert histories.replay_cold(wf, log)[0] == engine.Completed({"double": 42})


def test_a_raising_workflow_is_failed_with_its_exception() -> None:
    """When the runner raises, the flow records run_failed with that error."""

    async def wf() -> Any:
        value = await a()
        raise Boom(f"bad {value}")

    log = Log()
    log.step(0, "a", "input")
    outcome, _ = histories.replay_cold(wf, log)
    assert isinstance(outcome, engine.Failed)
    assert isinstance(outcome.error, Boom)
    assert str(outcome.error) == "bad input"


def test_an_unhandled_step_failure_fails_the_workflow_with_step_failed() -> None:
    """A ``step_failed`` nobody catches is the run's failure."""

    async def wf() -> Any:
        return await a()

    driver = LiveDriver(wf)
    driver.advance()
    driver.fail(0, "a", "out of stock")
    outcome = driver.advance()
    assert isinstance(outcome, engine.Failed)
    assert isinstance(outcome.error, errors.StepFailed)
    assert outcome.error.error_message == "out of stock"
    driver.assert_cold_agrees()


def test_a_workflow_with_no_operations_completes_on_the_first_advance() -> None:
    async def wf() -> str:
        return "nothing durable"

    assert histories.replay_cold(wf, Log())[0] == engine.Completed("nothing durable")


def test_run_cancelled_in_the_log_ends_the_replay() -> None:
    """``run_cancelled`` is a result like any other, reached by the walk: the replay ends
    with ``Ended("run_cancelled")`` even when outcomes follow it (REPLAY.md)."""

    async def wf() -> Any:
        return [await a(), await b()]

    log = Log()
    log.step_started(0, "a")
    log.cancelled("user asked")
    log.step_completed(0, "a", "too late")
    assert histories.replay_cold(wf, log)[0] == engine.Ended("run_cancelled")


def test_run_cancelled_while_live_ends_the_replay_and_cold_replay_agrees() -> None:
    async def wf() -> Any:
        await asyncio.sleep(3600)
        return await a()

    driver = LiveDriver(wf)
    assert isinstance(driver.advance(), engine.Suspended)
    driver.add(driver.log.cancelled())
    assert driver.advance() == engine.Ended("run_cancelled")
    driver.assert_cold_agrees()


def test_except_exception_cannot_swallow_a_suspension() -> None:
    """Suspending cannot be caught by ``except Exception``: the workflow is still
    waiting, and nothing past the await ran (REPLAY.md, "Suspension")."""
    reached: list[str] = []

    async def wf() -> Any:
        try:
            await a()
        except Exception:
            reached.append("except")
        reached.append("after")
        return "done"

    outcome = LiveDriver(wf).advance()
    assert isinstance(outcome, engine.Suspended)
    assert reached == []


# -- close ---------------------------------------------------------------------------


@pytest.fixture
def unraisable() -> Iterator[list[Any]]:
    """Exceptions Python could only report as unraisable (from __del__ and GC)."""
    seen: list[Any] = []
    previous = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        yield seen
    finally:
        sys.unraisablehook = previous


async def finally_with_a_step() -> Any:
    try:
        return await a()
    finally:
        await cleanup()


async def finally_with_a_sleep() -> Any:
    try:
        return await a()
    finally:
        await asyncio.sleep(30)


async def finally_with_a_hook() -> Any:
    try:
        return await a()
    finally:
        await hooks.create_hook("cleanup-token").payload()


async def finally_in_a_child_task() -> Any:
    async def child() -> Any:
        try:
            return await a()
        finally:
            await cleanup()

    return await asyncio.gather(child(), b())


@pytest.mark.parametrize(
    "workflow",
    [finally_with_a_step, finally_with_a_sleep, finally_with_a_hook, finally_in_a_child_task],
    ids=["step", "sleep", "hook", "child-task"],
)
def test_close_leaves_no_durable_operation_behind(
    workflow: histories.Workflow, unraisable: list[Any]
) -> None:
    """Closing a suspended replay does not run the workflow's ``finally:`` in a way that
    reaches a durable operation, now or at garbage collection: no step body runs, no
    new operation appears, no exception escapes (engine, ``Replay.close``)."""
    replay = histories.fresh(workflow, Log())
    assert isinstance(replay.advance(), engine.Suspended)
    before = (replay.position, sorted(replay._ops), sorted(replay._new))

    replay.close()
    after = (replay.position, sorted(replay._ops), sorted(replay._new))
    histories.OPENED.remove(replay)
    del replay
    gc.collect()

    ran, histories.BODY_CALLS[:] = list(histories.BODY_CALLS), []
    assert ran == [], "a step body ran, outside any replay, when the replay was closed"
    assert after == before, "the closed replay took new positions or operations"
    assert unraisable == []


def test_close_runs_no_finally_later_at_garbage_collection(unraisable: list[Any]) -> None:
    """The coroutine is finished by ``close``: collecting it later runs nothing."""
    ran: list[str] = []

    async def wf() -> Any:
        try:
            return await a()
        finally:
            ran.append("finally")

    replay = histories.fresh(wf, Log())
    assert isinstance(replay.advance(), engine.Suspended)
    replay.close()
    after_close = list(ran)
    histories.OPENED.remove(replay)
    del replay
    gc.collect()
    assert ran == after_close
    assert unraisable == []


# -- cost per step -------------------------------------------------------------------


def _ms_per_step(steps: int) -> float:
    async def loop_of_steps() -> int:
        for i in range(steps):
            await a(i)
        return steps

    best = float("inf")
    for _ in range(3):
        driver = LiveDriver(loop_of_steps)
        replay = driver.replay
        started = time.perf_counter()
        for position in range(steps):
            outcome = replay.advance()
            assert isinstance(outcome, engine.Suspended)
            (op,) = outcome.new
            replay.feed(driver.log.create(op))
            replay.feed(driver.log.step_completed(position, "a", position))
        assert replay.advance() == engine.Completed(steps)
        elapsed = time.perf_counter() - started
        replay.close()
        best = min(best, elapsed * 1000 / steps)
    return best


def test_a_steps_cost_does_not_grow_with_the_log() -> None:
    """A loop of sequential steps: the time per step at 2000 events is at most 3x the
    time per step at 250 (a complexity guard, not a benchmark)."""
    small = _ms_per_step(125)  # 250 events
    large = _ms_per_step(1000)  # 2000 events
    assert large <= 3 * small, f"{large:.3f} ms/step at 2000 events vs {small:.3f} at 250"


def test_a_cold_replay_of_a_long_log_is_linear() -> None:
    """Replaying a recorded log cold costs the same per event at 250 and 2000 events."""

    def ms_per_step(steps: int) -> float:
        async def loop_of_steps() -> int:
            for i in range(steps):
                await a(i)
            return steps

        log = Log()
        for position in range(steps):
            log.step(position, "a", position)
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            outcome, replay = histories.replay_cold(loop_of_steps, log)
            elapsed = time.perf_counter() - started
            assert outcome == engine.Completed(steps)
            replay.close()
            best = min(best, elapsed * 1000 / steps)
        return best

    small, large = ms_per_step(125), ms_per_step(1000)
    assert large <= 3 * small, f"{large:.3f} ms/step at 2000 events vs {small:.3f} at 250"
