"""Timers become durable waits, hooks and their conflicts, and what a log holds after
an entity's outcome (REPLAY.md, "The loop", "Results in log order")."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from treadle import errors
from treadle.replay import engine, operations
from treadle.sdk import hooks, timing

from . import histories
from .histories import START, LiveDriver, Log

a = histories.step("a")
b = histories.step("b")


async def with_asyncio_sleep() -> str:
    await asyncio.sleep(30)
    return "slept"


async def with_treadle_sleep() -> str:
    await timing.sleep("1m")
    return "slept"


async def with_treadle_sleep_until() -> str:
    await timing.sleep(until=START + dt.timedelta(hours=2))
    return "slept"


async def with_wait_for() -> str:
    try:
        return str(await asyncio.wait_for(a(), 10))
    except TimeoutError:
        return "timed out"


async def with_timeout() -> str:
    try:
        async with asyncio.timeout(5):
            return str(await a())
    except TimeoutError:
        return "timed out"


# (workflow, the new operations at the first suspension, the timer's position)
TIMERS = {
    "asyncio.sleep": (with_asyncio_sleep, [(0, "wait", START + dt.timedelta(seconds=30))], 0),
    "treadle.sleep": (with_treadle_sleep, [(0, "wait", START + dt.timedelta(minutes=1))], 0),
    "treadle.sleep-until": (
        with_treadle_sleep_until,
        [(0, "wait", START + dt.timedelta(hours=2))],
        0,
    ),
    "asyncio.wait_for": (
        with_wait_for,
        [(0, "step", "a"), (1, "wait", START + dt.timedelta(seconds=10))],
        1,
    ),
    "asyncio.timeout": (
        with_timeout,
        [(0, "wait", START + dt.timedelta(seconds=5)), (1, "step", "a")],
        0,
    ),
}


def _brief(op: Any) -> tuple[Any, ...]:
    return (op.position, op.kind, op.resume_at if op.kind == "wait" else op.step_name)


@pytest.mark.parametrize("name", list(TIMERS))
def test_every_timer_in_workflow_code_becomes_a_durable_wait(name: str) -> None:
    """``asyncio.sleep``, ``treadle.sleep``, ``asyncio.wait_for`` and ``asyncio.timeout``
    all create a wait (a ``Sleep`` operation, due at clock + delay) (REPLAY.md)."""
    workflow, expected, wait_position = TIMERS[name]
    driver = LiveDriver(workflow)
    outcome = driver.advance()
    assert isinstance(outcome, engine.Suspended)
    assert [_brief(op) for op in outcome.new] == expected
    driver.wake(wait_position)
    final = driver.advance()
    assert final == engine.Completed("timed out" if len(expected) == 2 else "slept")
    driver.assert_cold_agrees()


def test_a_zero_or_past_sleep_is_not_a_wait() -> None:
    """A timer already due does not go to the log: nothing to wait for."""

    async def wf() -> Any:
        await asyncio.sleep(0)
        await timing.sleep(until=START - dt.timedelta(days=1))
        return await a()

    outcome = LiveDriver(wf).advance()
    assert isinstance(outcome, engine.Suspended)
    assert [_brief(op) for op in outcome.new] == [(0, "step", "a")]


def test_a_timer_cancelled_before_the_suspension_is_not_written() -> None:
    """``wait_for(step(), 10)`` whose step outcome is already in the log: its timer is
    created and cancelled within one pass, so only the next step is new."""

    async def wf() -> list[Any]:
        first = await asyncio.wait_for(a(), 10)
        return [first, await b()]

    log = Log()
    log.step(0, "a", "A")
    outcome, _ = histories.replay_cold(wf, log)
    assert isinstance(outcome, engine.Suspended)
    assert [_brief(op) for op in outcome.new] == [(2, "step", "b")]


def test_a_live_wait_for_timer_is_written_then_left_open_once_the_step_wins() -> None:
    """Live, the timer is new at the same suspension as its step; once the step's outcome
    is walked the timer is cancelled and never written again; cold replay agrees."""

    async def wf() -> list[Any]:
        first = await asyncio.wait_for(a(), 10)
        return [first, await b()]

    driver = LiveDriver(wf)
    first = driver.advance()
    assert isinstance(first, engine.Suspended)
    assert [op.kind for op in first.new] == ["step", "wait"]
    driver.complete(0, "a", "A")
    second = driver.advance()
    assert isinstance(second, engine.Suspended)
    assert [_brief(op) for op in second.new] == [(2, "step", "b")]
    driver.complete(2, "b", "B")
    assert driver.advance() == engine.Completed(["A", "B"])
    driver.assert_cold_agrees()


# -- hooks ---------------------------------------------------------------------------


async def conflict_seen_early() -> list[Any]:
    fa = a()
    hook = hooks.create_hook("tok")
    conflict = hook.conflict()
    payload = asyncio.ensure_future(hook.payload())
    done, _ = await asyncio.wait([fa, payload], return_when=asyncio.FIRST_COMPLETED)
    winner = "a" if fa in done else "payload"
    try:
        await payload
    except errors.HookConflictError as exc:
        awaited = ["HookConflictError", exc.token, exc.holder_run_id]
    else:  # pragma: no cover
        awaited = ["no error"]
    holder = None if conflict is None else conflict.holder_run_id
    return [holder, winner, awaited]


def test_hook_conflict_is_visible_to_conflict_at_once_but_to_await_only_when_walked() -> None:
    """``conflict()`` returns the conflict as soon as ``hook_conflict`` is fed, before the
    walk reaches it; awaiting the payload raises ``HookConflictError`` only when the
    walk gets there, so the step whose outcome comes first wins the race (REPLAY.md,
    "Exception: a hook conflict ...")."""
    log = Log()
    log.step_started(0, "a")
    log.step_completed(0, "a", "A")
    log.hook_conflict(1, "tok", holder="wrun_holder")
    for _ in range(2):
        outcome, _replay = histories.replay_cold(conflict_seen_early, log)
        assert outcome == engine.Completed(
            ["wrun_holder", "a", ["HookConflictError", "tok", "wrun_holder"]]
        )


def test_hook_conflict_fed_after_creation_is_visible_to_conflict_before_it_is_walked() -> None:
    """A conflict the World wrote in place of a live ``hook_created`` is seen by
    ``conflict()`` as soon as it is fed, even while the walk is still on earlier events."""

    async def wf() -> list[Any]:
        fa = a()
        hook = hooks.create_hook("tok")
        await fa
        conflict = hook.conflict()
        return [None if conflict is None else conflict.holder_run_id]

    log = Log()
    replay = histories.fresh(wf, log)
    outcome = replay.advance()
    assert isinstance(outcome, engine.Suspended)
    assert [op.kind for op in outcome.new] == ["step", "hook"]
    replay.feed(log.create(outcome.new[0]))
    replay.feed(log.step_completed(0, "a", "A"))
    # The World refused the hook: its conflict lands after the step's outcome.
    replay.feed(log.hook_conflict(1, "tok", holder="wrun_holder"))
    assert replay.advance() == engine.Completed(["wrun_holder"])
    cold, _ = histories.replay_cold(wf, log)
    assert cold == engine.Completed(["wrun_holder"])


def test_a_live_hook_conflict_fails_the_awaiting_workflow_with_hook_conflict_error() -> None:
    """``Hook.wait`` on a token another run holds raises ``HookConflictError``."""

    async def wf() -> str:
        try:
            await histories.Approval.wait(token="taken")
        except errors.HookConflictError as exc:
            return f"conflict with {exc.holder_run_id}"
        return "no conflict"  # pragma: no cover

    driver = LiveDriver(wf)
    driver.held_tokens["taken"] = "wrun_holder"
    assert isinstance(driver.advance(), engine.Suspended)
    assert driver.advance() == engine.Completed("conflict with wrun_holder")
    driver.assert_cold_agrees()


# -- after an outcome ----------------------------------------------------------------


def test_a_second_step_completed_with_another_result_is_inert() -> None:
    """An entity's events after its outcome change nothing (seed 004: "A step whose
    result is already recorded refuses a second one"; replay must not see it either)."""

    async def wf() -> list[Any]:
        return [await a(), await b()]

    log = Log()
    log.step_started(0, "a")
    log.step_completed(0, "a", "first")
    log.step_completed(0, "a", "second")
    log.step_failed(0, "a", "late failure")
    log.step(1, "b", "B")
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Completed(["first", "B"])


def test_a_step_started_after_the_outcome_is_inert() -> None:
    """A stale attempt's ``step_started`` after the outcome neither re-opens the step
    nor diverges."""

    async def wf() -> list[Any]:
        return [await a(), await b()]

    log = Log()
    log.step(0, "a", "A")
    log.step_started(0, "a", attempt=2)
    log.step(1, "b", "B")
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Completed(["A", "B"])


def test_a_second_wait_completed_is_inert() -> None:
    """A duplicate ``wait_completed`` does not fire the timer twice or wake anything."""

    async def wf() -> list[Any]:
        await asyncio.sleep(5)
        first = await a()
        await asyncio.sleep(5)
        return [first, await b()]

    log = Log()
    log.wait_created(0)
    log.wait_completed(0)
    log.wait_completed(0)
    log.step(1, "a", "A")
    log.wait_completed(0)
    log.wait_created(2)
    log.wait_completed(2)
    log.step(3, "b", "B")
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Completed(["A", "B"])


def test_a_hook_resolves_once_later_payloads_are_inert() -> None:
    """The first ``hook_received`` is the payload; later ones do not change it."""

    async def wf() -> list[Any]:
        hook = hooks.create_hook("t")
        first = await hook.payload()
        return [first, await a()]

    log = Log()
    log.hook_created(0, "t")
    log.hook_received(0, "one")
    log.hook_received(0, "two")
    log.step(1, "a", "A")
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Completed(["one", "A"])


def test_a_sleep_with_a_changed_duration_keeps_the_recorded_wait() -> None:
    """Not detected (REPLAY.md, "Not detected"): a changed sleep duration matches the
    recorded wait; no new wait is written, and it ends where its wait_completed is."""

    async def wf() -> str:
        await asyncio.sleep(999_999)
        return "woke"

    log = Log()
    log.wait_created(0, resume_at=START + dt.timedelta(seconds=5))
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Suspended(new=[], dispose=[])
    log.wait_completed(0)
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Completed("woke")


def test_a_hook_disposed_in_the_pass_that_created_it_is_new_and_marked_for_disposal() -> None:
    """Bug 6 (the ordering gap): create, dispose, re-create one token in one pass. Both
    hooks are new at the suspension, in position order, the first marked
    ``dispose_requested`` (the orchestrator writes its disposal right after its creation);
    nothing is in ``dispose``, which holds only hooks already in the log."""

    async def wf() -> Any:
        first = hooks.create_hook("cycle")
        first.dispose()
        return await hooks.create_hook("cycle").payload()

    outcome, replay = histories.replay_cold(wf, Log())
    assert isinstance(outcome, engine.Suspended)
    assert [(op.position, op.kind) for op in outcome.new] == [(0, "hook"), (1, "hook")]
    first, second = outcome.new
    assert isinstance(first, operations.HookWait)
    assert isinstance(second, operations.HookWait)
    assert (first.dispose_requested, second.dispose_requested) == (True, False)
    assert outcome.dispose == []
    replay.close()


def test_a_conflicted_hook_is_never_disposed() -> None:
    """A hook whose creation the World answered with hook_conflict never held its token:
    disposing it asks for no hook_disposed (seed 003 "Hook conflicts")."""

    async def wf() -> Any:
        hook = hooks.create_hook("theirs")
        hook.dispose()
        return await timing.sleep("1m")

    log = Log()
    log.hook_conflict(0, "theirs", holder="wrun_holder")
    outcome, replay = histories.replay_cold(wf, log)
    assert isinstance(outcome, engine.Suspended)
    assert outcome.dispose == []
    assert [op.kind for op in outcome.new] == ["wait"]
    replay.close()
