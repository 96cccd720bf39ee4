"""Determinism aids and refusals: the workflow clock, replay-stable randomness, and
calls that need real I/O (REPLAY.md, "The loop", "Determinism aids")."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import uuid
from typing import Any

import pytest

from treadle import errors
from treadle.replay import engine
from treadle.sdk import determinism, timing
from treadle.world import events, ids

from . import histories
from .histories import START, LiveDriver, Log

a = histories.step("a")
b = histories.step("b")

# Odd microseconds, so a clock that loses precision shows.
ODD_TICK = dt.timedelta(seconds=1, microseconds=234_567)


async def clock_readings() -> list[dt.datetime]:
    started = timing.now()
    await a()
    after_a = timing.now()
    await asyncio.sleep(60)
    after_sleep = timing.now()
    await b()
    return [started, after_a, after_sleep, timing.now()]


def test_now_is_the_time_of_the_last_event_the_walk_consumed() -> None:
    """``now()`` starts at the run's creation time (read back from the run id) and then
    equals the ``created_at`` of the last consumed event (REPLAY.md, "The loop")."""
    driver = LiveDriver(clock_readings, tick=ODD_TICK)
    positions = []
    for _ in range(3):
        suspended = driver.advance()
        assert isinstance(suspended, engine.Suspended)
        positions += [op.position for op in suspended.new]
        if len(positions) == 1:
            completed_a = driver.log.step_completed(positions[0], "a")
            driver.add(completed_a)
        elif len(positions) == 2:
            woke = driver.log.wait_completed(positions[1])
            driver.add(woke)
        else:
            completed_b = driver.log.step_completed(positions[2], "b")
            driver.add(completed_b)
    # now() takes a position too (REPLAY.md, "Operations and positions").
    assert positions == [1, 3, 5]
    outcome = driver.advance()
    assert outcome == engine.Completed(
        [
            ids.run_created_at(driver.log.run_id),
            completed_a.created_at,
            woke.created_at,
            completed_b.created_at,
        ]
    )
    assert ids.run_created_at(driver.log.run_id) == START
    driver.assert_cold_agrees()


def test_now_is_stable_across_cold_replays_of_a_longer_log() -> None:
    """Events after the one that woke the workflow do not move its clock: later
    replays of a longer log read the same times."""
    log = Log(tick=ODD_TICK)
    log.step(1, "a")
    log.wait_created(3, resume_at=log.last_at + dt.timedelta(seconds=60))
    log.wait_completed(3)
    log.step(5, "b")
    first, _ = histories.replay_cold(clock_readings, log)
    log.append(events.AttrSet(key="later", value=1), at=log.last_at + dt.timedelta(days=30))
    log.append(events.WakeRequested(), at=log.last_at + dt.timedelta(days=60))
    second, _ = histories.replay_cold(clock_readings, log)
    assert isinstance(first, engine.Completed)
    assert first == second
    times = [e.created_at for e in log.events]
    assert first.value == [START, times[2], times[4], times[6]]


def test_sleep_until_is_measured_from_the_workflow_clock() -> None:
    """``sleep(until=)`` computes its delay from ``now()``, so the recorded due time is
    exactly the requested one."""
    due = START + dt.timedelta(days=2, microseconds=1)

    async def wf() -> None:
        await timing.sleep(until=due)

    outcome = LiveDriver(wf).advance()
    assert isinstance(outcome, engine.Suspended)
    assert [getattr(op, "resume_at", None) for op in outcome.new] == [due]


async def draws() -> list[Any]:
    values: list[Any] = [determinism.random(), determinism.uuid4()]
    values.append(await a())
    values += [determinism.random(), determinism.uuid4()]
    return values


def _draws_of(run_id: str) -> list[Any]:
    log = Log(run_id=run_id)
    log.step(2, "a", "A")
    outcome, _ = histories.replay_cold(draws, log)
    assert isinstance(outcome, engine.Completed)
    return list(outcome.value)


def test_random_and_uuid4_are_the_same_on_every_replay_of_a_run() -> None:
    """``random()`` and ``uuid4()`` replay the same values (REPLAY.md, "Determinism")."""
    run_id = histories.new_run_id()
    first = _draws_of(run_id)
    assert first == _draws_of(run_id)
    assert 0 <= first[0] < 1
    assert isinstance(first[1], uuid.UUID)
    assert first[1].version == 4
    assert first[0] != first[3]
    assert first[1] != first[4]


def test_random_and_uuid4_differ_across_runs() -> None:
    """Two runs of one workflow draw different values (seeded by the run id)."""
    one = _draws_of(histories.new_run_id())
    two = _draws_of(histories.new_run_id())
    assert one[0] != two[0]
    assert one[1] != two[1]


def test_random_and_uuid4_live_and_cold_agree() -> None:
    """The live delivery and every cold replay of its log draw the same values."""
    driver = LiveDriver(draws)
    outcome = driver.advance()
    assert isinstance(outcome, engine.Suspended)
    assert [(op.position, op.kind) for op in outcome.new] == [(2, "step")]
    driver.complete(2, "a", "A")
    assert isinstance(driver.advance(), engine.Completed)
    driver.assert_cold_agrees()


# -- calls that need real I/O --------------------------------------------------------

RAN_IN_A_THREAD: list[str] = []


def _blocking() -> str:
    RAN_IN_A_THREAD.append(threading.current_thread().name)
    return "ran"


async def _run_in_executor() -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, _blocking)


async def _to_thread() -> Any:
    return await asyncio.to_thread(_blocking)


async def _open_connection() -> Any:
    return await asyncio.open_connection("127.0.0.1", 9)


async def _subprocess() -> Any:
    return await asyncio.create_subprocess_exec("true")


async def _start_server() -> Any:
    return await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)


async def _getaddrinfo() -> Any:
    return await asyncio.get_running_loop().getaddrinfo("localhost", 80)


CALLS = {
    "run_in_executor": (_run_in_executor, "run_in_executor()"),
    "to_thread": (_to_thread, "run_in_executor()"),
    "open_connection": (_open_connection, "asyncio loop.create_connection()"),
    "subprocess": (_subprocess, "asyncio loop.subprocess_exec()"),
    "start_server": (_start_server, "asyncio loop.create_server()"),
    "getaddrinfo": (_getaddrinfo, "asyncio loop.getaddrinfo()"),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_io_in_workflow_code_raises_non_deterministic_call_at_the_call_site(name: str) -> None:
    """Anything that needs a selector, a thread or a process raises
    ``NonDeterministicCall`` naming the call, where the workflow can catch it."""
    call, named = CALLS[name]

    async def wf() -> Any:
        try:
            await call()
        except errors.NonDeterministicCall as exc:
            return ["caught", exc.call]
        return ["not refused"]

    RAN_IN_A_THREAD.clear()
    outcome, _ = histories.replay_cold(wf, Log())
    assert outcome == engine.Completed(["caught", named])
    assert RAN_IN_A_THREAD == []


def test_an_uncaught_non_deterministic_call_fails_the_run() -> None:
    """Uncaught, the refusal is the workflow's failure, on the first delivery."""
    outcome, _ = histories.replay_cold(_open_connection, Log())
    assert isinstance(outcome, engine.Failed)
    assert isinstance(outcome.error, errors.NonDeterministicCall)
    assert "create_connection" in str(outcome.error)


def test_the_workflow_loop_is_the_running_loop_only_inside_the_workflow() -> None:
    """Workflow code sees the deterministic loop as its running loop; the caller's loop
    (none here) is restored after each pass."""
    seen: list[Any] = []

    async def wf() -> Any:
        seen.append(asyncio.get_running_loop())
        return await a()

    replay = histories.fresh(wf, Log())
    replay.advance()
    assert seen == [replay.loop]
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()


async def test_advancing_inside_a_running_event_loop_restores_that_loop() -> None:
    """The orchestrator advances replays from its own asyncio loop: that loop is the
    running loop again once ``advance`` returns."""
    outer = asyncio.get_running_loop()

    async def wf() -> Any:
        assert asyncio.get_running_loop() is not outer
        return await a()

    replay = histories.fresh(wf, Log())
    assert isinstance(replay.advance(), engine.Suspended)
    assert asyncio.get_running_loop() is outer
    await asyncio.sleep(0)
