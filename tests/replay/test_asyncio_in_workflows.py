"""Plain asyncio inside a workflow, and the log shapes the orchestrator writes around
it (REPLAY.md, "The loop": create_task, gather, wait, shield, Event, Queue work
unchanged; seed 004, "Deliveries")."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from treadle import errors
from treadle.replay import engine
from treadle.sdk import hooks, timing
from treadle.world import events

from . import histories
from .histories import LiveDriver, Log

a = histories.step("a")
b = histories.step("b")
c = histories.step("c")


async def _at_own_time(step: Any) -> list[Any]:
    value = await step()
    return [value, timing.now()]


async def two_tasks() -> list[Any]:
    return list(await asyncio.gather(_at_own_time(a), _at_own_time(b)))


def test_each_task_resumes_at_the_time_of_its_own_result() -> None:
    """The walk consumes one event and runs the loop until idle before the next: a task
    woken by the first result reads that event's time, not the last one's."""
    log = Log()
    log.step_started(0, "a")
    log.step_started(1, "b")
    done_b = log.step_completed(1, "b", "B")
    done_a = log.step_completed(0, "a", "A", at=log.last_at + dt.timedelta(hours=5))
    outcome, _ = histories.replay_cold(two_tasks, log)
    assert outcome == engine.Completed([["A", done_a.created_at], ["B", done_b.created_at]])


async def queue_and_event() -> list[Any]:
    queue: asyncio.Queue[Any] = asyncio.Queue()
    ready = asyncio.Event()

    async def producer() -> None:
        for step in (a, b):
            await queue.put(await step())
        ready.set()

    async def consumer() -> list[Any]:
        await ready.wait()
        return [queue.get_nowait() for _ in range(queue.qsize())]

    async with asyncio.TaskGroup() as group:
        group.create_task(producer())
        got = group.create_task(consumer())
    shielded = await asyncio.shield(c())
    return [*got.result(), shielded]


def test_queue_event_taskgroup_and_shield_work_unchanged() -> None:
    """asyncio primitives only use the loop's futures and callbacks, so they just work;
    live and cold replay agree."""
    driver = LiveDriver(queue_and_event)
    for position, name in enumerate("abc"):
        outcome = driver.advance()
        assert isinstance(outcome, engine.Suspended)
        assert [histories.describe_op(op)[:2] for op in outcome.new] == [(position, "step")]
        driver.complete(position, name, name.upper())
    assert driver.advance() == engine.Completed(["A", "B", "C"])
    driver.assert_cold_agrees()


def test_a_background_step_with_retries_returns_its_final_result() -> None:
    """A background step is created by ``step_created`` (its ``step_started`` events carry
    no position) and retried with ``step_retrying``; only the outcome resolves it."""

    async def wf() -> list[Any]:
        return [await a(), await b()]

    log = Log()
    log.append(
        events.StepCreated(correlation_id=log.cid("step", 0), step_name="a", input=None, position=0)
    )
    cid = log.cid("step", 0)
    log.append(events.StepStarted(correlation_id=cid, step_name="a", attempt=1))
    log.append(
        events.StepRetrying(
            correlation_id=cid,
            step_name="a",
            attempt=1,
            error=events.ErrorInfo(message="flaky"),
        )
    )
    log.append(events.StepStarted(correlation_id=cid, step_name="a", attempt=2))
    log.step_completed(0, "a", "A on attempt 2")
    log.step(1, "b", "B")
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Completed(["A on attempt 2", "B"])


def test_a_wait_completed_for_a_cancelled_timer_is_inert() -> None:
    """``wait_for`` cancels its timer when the step wins; the timer's later
    ``wait_completed`` (the orchestrator wrote it, the wait being due) wakes nothing."""

    async def wf() -> list[Any]:
        first = await asyncio.wait_for(a(), 10)
        second = await b()
        return [first, second]

    log = Log()
    log.step_started(0, "a")
    log.wait_created(1)
    log.step_completed(0, "a", "A")
    log.step_started(2, "b")
    log.wait_completed(1)
    log.step_completed(2, "b", "B")
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Completed(["A", "B"])


def test_a_timed_out_hook_is_handed_back_for_disposal_once() -> None:
    """``Hook.wait(timeout=)`` that times out asks to dispose of its hook: the next
    suspension lists it in ``dispose``; once ``hook_disposed`` is in the log it is not
    listed again, live or cold."""

    async def wf() -> list[Any]:
        approval = await histories.Approval.wait(token="t", timeout="1h")
        return [approval, await a()]

    driver = LiveDriver(wf)
    first = driver.advance()
    assert isinstance(first, engine.Suspended)
    assert [op.kind for op in first.new] == ["hook", "wait"]
    driver.wake(1)
    second = driver.advance()
    assert isinstance(second, engine.Suspended)
    assert [histories.describe_op(op)[:2] for op in second.new] == [(2, "step")]
    assert [op.correlation_id for op in second.dispose] == [driver.log.cid("hook", 0)]
    for hook in second.dispose:
        driver.add(driver.log.append(events.HookDisposed(correlation_id=hook.correlation_id)))
        hook.disposed = True
    third = driver.advance()
    assert third == engine.Suspended(new=[], dispose=[])
    driver.complete(2, "a", "A")
    assert driver.advance() == engine.Completed([None, "A"])
    driver.assert_cold_agrees()


def test_awaiting_a_conflicting_hook_in_a_race_loses_to_an_earlier_result() -> None:
    """``asyncio.wait`` sees a hook conflict only where the walk reaches it."""

    async def wf() -> str:
        hook = hooks.create_hook("taken")
        payload = asyncio.ensure_future(hook.payload())
        fa = a()
        done, _ = await asyncio.wait([payload, fa], return_when=asyncio.FIRST_COMPLETED)
        return "payload" if payload in done else "a"

    log = Log()
    log.step_started(1, "a")
    log.step_completed(1, "a", "A")
    log.hook_conflict(0, "taken")
    assert histories.replay_cold(wf, log)[0] == engine.Completed("a")


# -- feeding -------------------------------------------------------------------------


def test_a_slot_fed_twice_is_ignored_and_a_gap_is_refused() -> None:
    """``feed`` takes slots in order from 1: a repeat (an echo of an own write) is
    ignored; a gap is a contract error, never silently skipped."""

    async def wf() -> Any:
        return await a()

    log = Log()
    log.step(0, "a", "A")
    replay = histories.fresh(wf, log, upto=2)
    replay.feed(log.events[0])
    replay.feed(log.events[1])
    assert replay.log_tail == 2
    gap = log.events[2].model_copy(update={"slot": 4})
    with pytest.raises(errors.WorldContractError):
        replay.feed(gap)
    replay.feed(log.events[2])
    assert replay.advance() == engine.Completed("A")
