"""The run timeout's wait and timeout blocks, replayed (issue 17 item 5, docs/timeouts.md):
the run timeout is a wait at position -1 that shifts no position of the code's, and its
``wait_completed``, where the walk reaches it, fails the run with ``RunTimedOut``; a
timeout block or a cancelled task decides from the log's order alone, live and cold."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from treadle import errors, timeout
from treadle.replay import engine, operations
from treadle.world import events

from . import histories
from .histories import Log

a = histories.step("a")
b = histories.step("b")


def _replay(wf: Any, log: Log, seconds: float | None, upto: int | None = None) -> engine.Replay:
    replay = engine.Replay(
        run_id=log.run_id,
        workflow_name=log.workflow_name,
        workflow=wf,
        args=[],
        kwargs={},
        run_timeout=seconds,
    )
    for logged in log.events[: log.tail if upto is None else upto]:
        replay.feed(logged)
    return replay


async def two_steps() -> list[Any]:
    return [await a(), await b()]


def test_the_run_timeout_is_a_wait_at_position_minus_one_beside_the_first_step() -> None:
    log = Log()
    replay = _replay(two_steps, log, 60.0)
    first = replay.advance()
    assert isinstance(first, engine.Suspended)
    assert [(op.position, op.kind) for op in first.new] == [(-1, "wait"), (0, "step")]
    deadline = first.new[0]
    assert isinstance(deadline, operations.RunDeadline)
    assert deadline.resume_at == log.events[0].created_at + timedelta(seconds=60)
    replay.close()


def test_a_run_without_a_timeout_has_no_such_wait() -> None:
    replay = _replay(two_steps, Log(), None)
    first = replay.advance()
    assert isinstance(first, engine.Suspended)
    assert [(op.position, op.kind) for op in first.new] == [(0, "step")]
    replay.close()


def _deadline_created(log: Log) -> None:
    log.append(
        events.WaitCreated(
            correlation_id=log.cid("wait", -1),
            resume_at=log.events[0].created_at + timedelta(seconds=60),
            position=-1,
        )
    )


def test_the_run_timeout_completing_before_an_outcome_fails_the_run_live_and_cold() -> None:
    log = Log()
    _deadline_created(log)
    log.step_started(0, "a")
    log.wait_completed(-1)
    log.step_completed(0, "a", "A")  # too late: the walk reached the deadline first
    outcome = _replay(two_steps, log, 60.0).advance()
    assert isinstance(outcome, engine.Failed)
    assert isinstance(outcome.error, errors.RunTimedOut)
    # The same log up to the step's outcome, before the deadline: the run goes on.
    early = Log(run_id=log.run_id)
    _deadline_created(early)
    early.step_started(0, "a")
    early.step_completed(0, "a", "A")
    early.wait_completed(-1)
    outcome = _replay(two_steps, early, 60.0, upto=early.tail - 1).advance()
    assert isinstance(outcome, engine.Suspended)
    assert [(op.position, op.step_name) for op in outcome.new] == [(1, "b")]  # type: ignore[attr-defined]


def test_a_timeout_block_times_out_only_where_its_wait_completes_in_the_log() -> None:
    async def wf() -> str:
        try:
            async with timeout("10s"):
                await a()
            return "in time"
        except TimeoutError:
            return "timed out"

    for wait_first, expected in ((True, "timed out"), (False, "in time")):
        log = Log()  # the block's timer takes position 0 (at its entry), the step 1
        log.wait_created(0)
        log.step_started(1, "a")
        if wait_first:
            log.wait_completed(0)
            log.step_completed(1, "a", "A")
        else:
            log.step_completed(1, "a", "A")
            log.wait_completed(0)
        outcome, replay = histories.replay_cold(wf, log)
        assert outcome == engine.Completed(expected)
        replay.close()


def test_a_cancelled_task_awaiting_a_step_ignores_its_result_live_and_cold() -> None:
    async def wf() -> str:
        task = asyncio.ensure_future(a())
        await asyncio.sleep(5)
        task.cancel()
        try:
            return str(await task)
        except asyncio.CancelledError:
            return str(await b())

    driver = histories.LiveDriver(wf)
    first = driver.advance()
    assert isinstance(first, engine.Suspended)
    assert [op.kind for op in first.new] == ["step", "wait"]
    driver.wake(1)
    second = driver.advance()
    assert isinstance(second, engine.Suspended)
    assert [op.kind for op in second.new] == ["step"]
    driver.complete(0, "a", "A")  # the cancelled task's step: recorded, ignored
    driver.complete(2, "b", "B")
    assert driver.advance() == engine.Completed("B")
    driver.assert_cold_agrees()


def test_an_event_stored_past_the_deadline_is_walked_after_it_even_without_its_wait() -> None:
    """A delayed timer: the deadline's wait_completed is not in the log yet, but the
    step's outcome was stored past the deadline: the run fails, live and cold."""
    log = Log()
    _deadline_created(log)
    log.step_started(0, "a")
    log.step_completed(0, "a", "A", at=log.events[0].created_at + timedelta(seconds=61))
    outcome = _replay(two_steps, log, 60.0).advance()
    assert isinstance(outcome, engine.Failed)
    assert isinstance(outcome.error, errors.RunTimedOut)
    in_time = _replay(two_steps, log, 61.5).advance()  # a later deadline: the step counts
    assert isinstance(in_time, engine.Suspended)
    # A terminal event past the deadline is still the log's end (a cancel won the race).
    cancelled = Log(run_id=log.run_id)
    _deadline_created(cancelled)
    cancelled.cancelled(at=cancelled.events[0].created_at + timedelta(seconds=62))
    assert _replay(two_steps, cancelled, 60.0).advance() == engine.Ended("run_cancelled")
