"""Results reach the workflow in log order (REPLAY.md, "Results in log order";
seed 004, "Delivering results in order")."""

from __future__ import annotations

import asyncio
import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

from treadle import errors, serde
from treadle.replay import engine
from treadle.sdk import hooks, timing
from treadle.world import events

from . import histories
from .histories import LiveDriver, Log

a = histories.step("a")
b = histories.step("b")
c = histories.step("c")


async def three_in_a_row() -> list[Any]:
    return [await a(1), await b(2), await c(3)]


def test_sequential_steps_return_their_recorded_results() -> None:
    """A recorded operation returns its recorded result (seed 004, "Deliveries")."""
    log = Log()
    log.step(0, "a", "first")
    log.step(1, "b", 2)
    log.step(2, "c", {"three": [3]})
    outcome, _ = histories.replay_cold(three_in_a_row, log)
    assert outcome == engine.Completed(["first", 2, {"three": [3]}])
    assert histories.BODY_CALLS == []


def test_sequential_steps_live_suspend_one_at_a_time_and_cold_replay_agrees() -> None:
    """Each delivery suspends on the one new step it waits on; cold replay of every
    prefix decides the same (REPLAY.md, "Suspension")."""
    driver = LiveDriver(three_in_a_row)
    for position, name in enumerate("abc"):
        outcome = driver.advance()
        assert isinstance(outcome, engine.Suspended)
        assert [(op.position, op.step_name, op.input) for op in outcome.new] == [  # type: ignore[attr-defined]
            (position, name, {"args": [position + 1], "kwargs": {}})
        ]
        driver.complete(position, name, name.upper())
    assert driver.advance() == engine.Completed(["A", "B", "C"])
    driver.assert_cold_agrees()


@pytest.mark.parametrize(
    "value",
    [
        dt.datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=dt.UTC),
        Decimal("12345678901234567890.000000001"),
        (1, "two", (3.5, None)),
        histories.Invoice(
            number="INV-7",
            total=Decimal("19.99"),
            issued=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
            lines=("tea", "cake"),
        ),
    ],
    ids=["datetime", "decimal", "tuple", "pydantic-model"],
)
def test_a_step_result_is_decoded_through_serde_exactly(value: Any) -> None:
    """The recorded result is rebuilt as the same Python value and type (serde)."""

    async def wf() -> Any:
        return await a()

    log = Log()
    log.step(0, "a", value)
    outcome, _ = histories.replay_cold(wf, log)
    assert isinstance(outcome, engine.Completed)
    assert outcome.value == value
    assert type(outcome.value) is type(value)
    assert serde.encode(outcome.value) == serde.encode(value)


async def gathered() -> list[Any]:
    return list(await asyncio.gather(a("x"), b("y"), c("z")))


async def _wrapped(step: Any, arg: str) -> Any:
    return await step(arg)


async def gathered_coroutines() -> list[Any]:
    return list(await asyncio.gather(_wrapped(a, "x"), _wrapped(b, "y"), _wrapped(c, "z")))


@pytest.mark.parametrize("workflow", [gathered, gathered_coroutines], ids=["futures", "coros"])
def test_gather_of_three_steps_creates_all_three_at_one_suspension_in_call_order(
    workflow: histories.Workflow,
) -> None:
    """Positions are taken at call time, in program order (REPLAY.md, "Operations and
    positions"); the three new steps are written in one decision ("Suspension")."""
    driver = LiveDriver(workflow)
    outcome = driver.advance()
    assert isinstance(outcome, engine.Suspended)
    assert [(op.position, op.kind, op.step_name) for op in outcome.new] == [  # type: ignore[attr-defined]
        (0, "step", "a"),
        (1, "step", "b"),
        (2, "step", "c"),
    ]
    # Outcomes in reverse order: gather still returns them in argument order.
    driver.complete(2, "c", "Z")
    driver.complete(0, "a", "X")
    driver.complete(1, "b", "Y")
    assert driver.advance() == engine.Completed(["X", "Y", "Z"])
    driver.assert_cold_agrees()


def _race(call_order: str) -> histories.Workflow:
    steps = {"a": a, "b": b}

    async def race() -> list[str]:
        futures = {name: steps[name]() for name in call_order}
        done, pending = await asyncio.wait(
            list(futures.values()), return_when=asyncio.FIRST_COMPLETED
        )
        winners = sorted(n for n, f in futures.items() if f in done)
        still = sorted(n for n, f in futures.items() if f in pending)
        return [*winners, "|", *still]

    return race


@pytest.mark.parametrize("call_order", ["ab", "ba"])
@pytest.mark.parametrize("log_order", ["ab", "ba"])
def test_a_race_between_two_steps_is_won_by_the_outcome_first_in_the_log(
    call_order: str, log_order: str
) -> None:
    """``asyncio.wait(FIRST_COMPLETED)``: when both results are in the log, the one
    recorded first wins, on every replay, whatever the argument order (REPLAY.md)."""
    workflow = _race(call_order)
    position = {name: i for i, name in enumerate(call_order)}
    log = Log()
    for name in call_order:
        log.step_started(position[name], name)
    for name in log_order:
        log.step_completed(position[name], name, name)
    first, second = log_order
    for _ in range(2):
        outcome, replay = histories.replay_cold(workflow, log)
        assert outcome == engine.Completed([first, "|", second])
        replay.close()


@pytest.mark.parametrize("call_order", ["ab", "ba"])
@pytest.mark.parametrize("log_order", ["ab", "ba"])
def test_a_live_race_is_won_by_the_outcome_recorded_first_and_cold_replay_agrees(
    call_order: str, log_order: str
) -> None:
    """Both outcomes committed before the next pass: the first in the log wins, live
    and cold alike (REPLAY.md, "Results in log order")."""
    driver = LiveDriver(_race(call_order))
    assert isinstance(driver.advance(), engine.Suspended)
    position = {name: i for i, name in enumerate(call_order)}
    for name in log_order:
        driver.complete(position[name], name, name)
    first, second = log_order
    assert driver.advance() == engine.Completed([first, "|", second])
    driver.assert_cold_agrees()


async def as_completed_race() -> str:
    for earliest in asyncio.as_completed([a(), b()]):
        return str(await earliest)
    raise AssertionError("unreachable")


@pytest.mark.parametrize("log_order", ["ab", "ba"])
def test_as_completed_yields_in_log_order(log_order: str) -> None:
    """``as_completed`` works unchanged and follows the log (REPLAY.md, "The loop")."""
    log = Log()
    log.step_started(0, "a")
    log.step_started(1, "b")
    for name in log_order:
        log.step_completed("ab".index(name), name, name)
    outcome, _ = histories.replay_cold(as_completed_race, log)
    assert outcome == engine.Completed(log_order[0])


async def hook_or_timeout() -> Any:
    approval = await histories.Approval.wait(token="order-1", timeout="1h")
    return None if approval is None else approval.by


@pytest.mark.parametrize("hook_first", [True, False], ids=["payload-first", "timeout-first"])
def test_a_race_between_a_hook_and_a_sleep_is_won_by_what_the_log_recorded_first(
    hook_first: bool,
) -> None:
    """``Hook.wait(timeout=)`` races a hook against a durable timer; the result first in
    the log wins on every replay (REPLAY.md, "Results in log order")."""
    log = Log()
    log.hook_created(0, "order-1")
    log.wait_created(1, resume_at=histories.START + dt.timedelta(hours=1))
    payload = {"approved": True, "by": "ann"}
    if hook_first:
        log.hook_received(0, payload)
        log.wait_completed(1)
    else:
        log.wait_completed(1)
        log.hook_received(0, payload)
    for _ in range(2):
        outcome, replay = histories.replay_cold(hook_or_timeout, log)
        assert outcome == engine.Completed("ann" if hook_first else None)
        replay.close()


def test_a_live_hook_and_sleep_race_suspends_on_both_and_cold_replay_agrees() -> None:
    """The hook and its timeout are created in one decision; the timeout fires first in
    the log, the hook is asked to be disposed (seed 004; REPLAY.md "Suspension")."""
    driver = LiveDriver(hook_or_timeout)
    outcome = driver.advance()
    assert isinstance(outcome, engine.Suspended)
    assert [(op.position, op.kind) for op in outcome.new] == [(0, "hook"), (1, "wait")]
    driver.wake(1)
    driver.receive(0, {"approved": False, "by": "late"})
    assert driver.advance() == engine.Completed(None)
    driver.assert_cold_agrees()


async def step_with_timeout() -> str:
    try:
        return str(await asyncio.wait_for(a(), 30))
    except TimeoutError:
        return "timed out"


@pytest.mark.parametrize("step_first", [True, False])
def test_wait_for_times_out_only_when_the_wait_completes_first_in_the_log(
    step_first: bool,
) -> None:
    """``asyncio.wait_for`` is a race between the step and a durable timer, settled in
    log order (REPLAY.md, "The loop")."""
    log = Log()
    log.step_started(0, "a")
    log.wait_created(1, resume_at=histories.START + dt.timedelta(seconds=30))
    if step_first:
        log.step_completed(0, "a", "done")
        log.wait_completed(1)
    else:
        log.wait_completed(1)
        log.step_completed(0, "a", "done")
    outcome, _ = histories.replay_cold(step_with_timeout, log)
    assert outcome == engine.Completed("done" if step_first else "timed out")


async def sleep_beside_a_step() -> list[Any]:
    sleeper = asyncio.ensure_future(timing.sleep("10s"))
    first = await a()
    slept_after_a = sleeper.done()
    second = await b()
    slept_after_b = sleeper.done()
    await sleeper
    return [first, slept_after_a, second, slept_after_b]


@pytest.mark.parametrize("resume_at", [histories.FAR_PAST, histories.FAR_FUTURE], ids=str)
def test_a_sleep_completes_where_its_wait_completed_sits_in_the_log_not_by_the_clock(
    resume_at: dt.datetime,
) -> None:
    """The clock passes the due time long before ``wait_completed``; the sleep still
    ends exactly where the log says (REPLAY.md, "A sleep completes where ...")."""
    # a() is called before the sleeper task first runs: a is position 0, the sleep 1.
    log = Log()
    log.step_started(0, "a")
    log.wait_created(1, resume_at=resume_at)
    # One day later: the workflow clock is far past the 10 s sleep, but no wait_completed.
    log.step_completed(0, "a", "A", at=log.last_at + dt.timedelta(days=1))
    log.step_started(2, "b")
    log.wait_completed(1)
    log.step_completed(2, "b", "B")
    outcome, _ = histories.replay_cold(sleep_beside_a_step, log)
    assert outcome == engine.Completed(["A", False, "B", True])


def test_a_sleep_does_not_complete_without_its_wait_completed_however_late_the_clock() -> None:
    """Without ``wait_completed`` the sleep stays pending, and the replay suspends on it
    with nothing new to write, even when the log's clock is far past its due time."""

    async def wf() -> str:
        await timing.sleep("1s")
        return "woke"

    log = Log()
    log.wait_created(0, resume_at=histories.FAR_PAST)
    log.append(events.AttrSet(key="k", value=1), at=log.last_at + dt.timedelta(days=400))
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Suspended(new=[], dispose=[])


def test_a_failed_step_raises_step_failed_which_except_exception_catches() -> None:
    """A ``step_failed`` outcome makes the await raise ``errors.StepFailed``; the
    workflow handles it and goes on (seed 004, "Replay divergence" contrasts this)."""

    async def wf() -> list[Any]:
        try:
            await a()
        except Exception as exc:
            caught = [type(exc).__name__]
            if isinstance(exc, errors.StepFailed):
                caught += [exc.step_name, exc.error_type, exc.error_message]
        return [caught, await b()]

    log = Log()
    log.step_started(0, "a")
    log.step_failed(0, "a", "no stock", error_type="FatalError")
    log.step(1, "b", "fallback")
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Completed([["StepFailed", "a", "FatalError", "no stock"], "fallback"])

    driver = LiveDriver(wf)
    driver.advance()
    driver.fail(0, "a", "no stock")
    driver.advance()
    driver.complete(1, "b", "fallback")
    assert driver.advance() == engine.Completed(
        [["StepFailed", "a", "ValueError", "no stock"], "fallback"]
    )
    driver.assert_cold_agrees()


def test_a_hook_payload_arrives_where_hook_received_sits() -> None:
    """``create_hook(...).payload()`` resolves when the walk reaches ``hook_received``."""

    async def wf() -> Any:
        hook = hooks.create_hook("t-1")
        first = await a()
        return [first, await hook.payload()]

    driver = LiveDriver(wf)
    outcome = driver.advance()
    assert isinstance(outcome, engine.Suspended)
    assert [(op.kind, op.position) for op in outcome.new] == [("hook", 0), ("step", 1)]
    driver.receive(0, {"k": [1, 2]})
    driver.complete(1, "a", "A")
    assert driver.advance() == engine.Completed(["A", {"k": [1, 2]}])
    driver.assert_cold_agrees()
