"""Divergence: the code and the log disagree at a position (REPLAY.md, "Operations and
positions"; seed 004, "Replay divergence")."""

from __future__ import annotations

import asyncio
from typing import Any

from treadle.replay import engine
from treadle.sdk import hooks

from . import histories
from .histories import Log

a = histories.step("a")
b = histories.step("b")


def test_a_step_where_a_wait_was_recorded_diverges() -> None:
    """An operation of another kind at a recorded position: a step where a sleep was."""

    async def wf() -> Any:
        return await a()

    log = Log()
    log.wait_created(0)
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Diverged(position=0, recorded="a sleep", reached="step a")


def test_a_wait_where_a_step_was_recorded_diverges() -> None:
    """The other way round: a sleep where a step was recorded."""

    async def wf() -> Any:
        await asyncio.sleep(10)
        return await a()

    log = Log()
    log.step(0, "a", "A")
    outcome, _ = histories.replay_cold(wf, log)
    assert isinstance(outcome, engine.Diverged)
    assert outcome.position == 0
    assert outcome.recorded == "step a"
    assert outcome.reached.startswith("a sleep until ")


def test_another_step_function_at_a_recorded_position_diverges() -> None:
    """A step that calls a different step function than the one recorded."""

    async def wf() -> Any:
        first = await a()
        return [first, await b()]

    log = Log()
    log.step(0, "a", "A")
    log.step_started(1, "c")
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Diverged(position=1, recorded="step c", reached="step b")


def test_a_hook_with_another_token_diverges() -> None:
    """A hook with a different token than the one recorded."""

    async def wf() -> Any:
        return await hooks.create_hook("order-2").payload()

    log = Log()
    log.hook_created(0, "order-1")
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Diverged(
        position=0, recorded="hook 'order-1'", reached="hook 'order-2'"
    )


def test_a_hook_with_another_token_than_a_recorded_conflict_diverges() -> None:
    """``hook_conflict`` stands in for the creation: its token is checked too."""

    async def wf() -> Any:
        return hooks.create_hook("mine").conflict() is None

    log = Log()
    log.hook_conflict(0, "theirs")
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Diverged(position=0, recorded="hook 'theirs'", reached="hook 'mine'")


def test_returning_before_a_recorded_operation_diverges() -> None:
    """A workflow that returns without reaching a recorded operation (a step was removed)."""

    async def wf() -> Any:
        return await a()

    log = Log()
    log.step(0, "a", "A")
    log.step_started(1, "b")
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Diverged(
        position=1, recorded="step b", reached="the workflow returned before it"
    )


def test_failing_before_a_recorded_operation_diverges() -> None:
    """Raising before a recorded operation is a divergence too, not a run failure."""

    async def wf() -> Any:
        await a()
        raise ValueError("changed code")

    log = Log()
    log.step(0, "a", "A")
    log.wait_created(1)
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Diverged(
        position=1, recorded="a sleep", reached="the workflow returned before it"
    )


def test_divergence_is_reported_at_the_first_wrong_position() -> None:
    """With several mismatches, the first position is the one named."""

    async def wf() -> Any:
        return await asyncio.gather(b(), b(), b())

    log = Log()
    log.step_started(0, "b")
    log.step_started(1, "a")
    log.step_started(2, "a")
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Diverged(position=1, recorded="step a", reached="step b")


def test_user_code_cannot_catch_a_divergence() -> None:
    """The delivery ends instead of returning an error to the runner, so ``except
    Exception`` cannot carry on with misaligned results (seed 004)."""
    reached: list[str] = []

    async def wf() -> Any:
        try:
            await b()
        except Exception:
            reached.append("except")
            return "swallowed"
        finally:
            reached.append("finally")
        return await a()  # pragma: no cover

    log = Log()
    log.step(0, "a", "A")
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Diverged(position=0, recorded="step a", reached="step b")
    assert "except" not in reached


def test_catching_base_exception_does_not_hide_a_divergence() -> None:
    """A workflow must not catch ``BaseException``; if it does, the divergence still wins
    (REPLAY.md, "Suspension": detect a swallowed signal)."""

    async def wf() -> Any:
        try:
            await b()
        except BaseException:
            return "swallowed"

    log = Log()
    log.step(0, "a", "A")
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Diverged(position=0, recorded="step a", reached="step b")


def test_the_same_divergence_on_every_cold_replay() -> None:
    """A fresh replay of a diverging log diverges the same way (the recovery delivery
    replays cold; seed 004)."""

    async def wf() -> Any:
        return [await a(), await a()]

    log = Log()
    log.step(0, "a", "A")
    log.wait_created(1)
    results = [histories.replay_cold(wf, log)[0] for _ in range(3)]
    assert results == [engine.Diverged(position=1, recorded="a sleep", reached="step a")] * 3


def test_a_changed_step_input_is_not_detected_and_returns_the_recorded_result() -> None:
    """Not detected (REPLAY.md): the recorded result is returned for another input."""

    async def wf(amount: int) -> Any:
        return await a(amount)

    log = Log(args=[999])
    log.step_started(0, "a", input={"args": [1], "kwargs": {}})
    log.step_completed(0, "a", "charged 1")
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Completed("charged 1")


def test_the_same_step_called_in_another_order_matches_by_name() -> None:
    """Not detected (REPLAY.md): calls to one step function in another order match by
    name, so each call gets the result recorded at its position."""

    async def wf(items: list[str]) -> Any:
        return [await a(item) for item in items]

    log = Log(args=[["y", "x"]])
    log.step_started(0, "a", input={"args": ["x"], "kwargs": {}})
    log.step_completed(0, "a", "for x")
    log.step_started(1, "a", input={"args": ["y"], "kwargs": {}})
    log.step_completed(1, "a", "for y")
    outcome, _ = histories.replay_cold(wf, log)
    assert outcome == engine.Completed(["for x", "for y"])


def test_a_creation_fed_for_a_reached_position_with_another_step_name_diverges() -> None:
    """Live (consume-after-commit): the code already reached step b at position 1 when a
    creation for step c at position 1 is fed (another writer's, say, during a rolling
    deploy). Replay must check it and diverge, as a cold replay of that log does; it must
    not hand step c's result to the await of step b (REPLAY.md, "replay checks that the
    code reaches a matching operation at each recorded position")."""

    async def wf() -> Any:
        first = await a()
        return [first, await b()]

    log = Log()
    replay = histories.fresh(wf, log)
    suspended = replay.advance()
    assert isinstance(suspended, engine.Suspended)
    replay.feed(log.create(suspended.new[0]))
    replay.feed(log.step_completed(0, "a", "A"))
    suspended = replay.advance()
    assert isinstance(suspended, engine.Suspended)
    assert [histories.describe_op(op)[:2] for op in suspended.new] == [(1, "step")]
    replay.feed(log.step_started(1, "c"))
    replay.feed(log.step_completed(1, "c", "C"))
    cold, _ = histories.replay_cold(wf, log)
    assert cold == engine.Diverged(position=1, recorded="step c", reached="step b")
    assert replay.advance() == cold


def test_a_creation_fed_for_a_reached_position_with_another_kind_diverges() -> None:
    """Live: the code reached step b at position 1, then a ``wait_created`` at position 1
    is fed. The replay must diverge, not offer step b again as new."""

    async def wf() -> Any:
        first = await a()
        return [first, await b()]

    log = Log()
    replay = histories.fresh(wf, log)
    suspended = replay.advance()
    assert isinstance(suspended, engine.Suspended)
    replay.feed(log.create(suspended.new[0]))
    replay.feed(log.step_completed(0, "a", "A"))
    assert isinstance(replay.advance(), engine.Suspended)
    replay.feed(log.wait_created(1))
    cold, _ = histories.replay_cold(wf, log)
    assert cold == engine.Diverged(position=1, recorded="a sleep", reached="step b")
    assert replay.advance() == cold
