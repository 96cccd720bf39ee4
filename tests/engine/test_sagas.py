"""Sagas (issue 17 item 7): compensations run in reverse as durable steps, on the local
World and on Postgres + NATS; a finished saga's log replays to the same decisions."""

from __future__ import annotations

from typing import Any

import pytest

from treadle import FatalError, Saga, SagaCompensated, StepFailed, step_metadata
from treadle.world import events

from .conftest import MakeApp
from .replaycheck import assert_replays_to_the_same_decisions


def _flows(make_app: MakeApp) -> Any:
    app = make_app()

    @app.step
    async def book(what: str) -> str:
        return f"{what}-booked"

    @app.step(max_retries=0)
    async def refuse(what: str) -> str:
        raise FatalError(f"no {what} available")

    @app.step
    async def undo(booking: str) -> str:
        return f"undid {booking}"

    @app.step(max_retries=1)
    async def broken_undo(booking: str) -> str:
        raise RuntimeError(f"cannot undo {booking} (attempt {step_metadata().attempt})")

    @app.workflow
    async def trip(fail_at: str, mode: str) -> Any:
        saga = Saga(
            parallel=mode == "parallel",
            reraise=mode == "reraise",
            continue_on_error=mode != "stop",
        )
        try:
            async with saga:
                for what in ("flight", "hotel", "car"):
                    booking = await (refuse(what) if what == fail_at else book(what))
                    broken = mode in ("broken", "stop") and what == "hotel"
                    saga.add(broken_undo if broken else undo, booking)
        except SagaCompensated as exc:
            return {
                "error": type(exc.error).__name__,
                "message": str(exc.error),
                "failed": [name for name, _ in exc.compensation_errors],
                "cause_is_error": exc.__cause__ is exc.error,
            }
        except StepFailed as exc:
            return {"reraised": str(exc), "notes": getattr(exc, "__notes__", [])}
        return "booked"

    @app.workflow
    async def not_a_step() -> str:
        saga = Saga()
        async with saga:
            saga.add(print, "x")
        return "unreachable"

    @app.workflow
    async def bad_args() -> str:
        saga = Saga()
        async with saga:
            saga.add(undo, object())
        return "unreachable"

    return app


def _step_order(logged: list[events.LoggedEvent]) -> list[tuple[str, str]]:
    return [
        (e.event.step_name, e.type)  # type: ignore[union-attr]
        for e in logged
        if e.type in ("step_completed", "step_failed")
    ]


async def test_a_failed_step_undoes_the_earlier_ones_in_reverse(make_app: MakeApp) -> None:
    app = _flows(make_app)
    run = await app.start("trip", "car", "serial")
    result = await run.result(timeout=30)
    assert result == {
        "error": "StepFailed",
        "message": result["message"],
        "failed": [],
        "cause_is_error": True,
    }
    assert "no car available" in result["message"]
    logged = await run.events()
    assert _step_order(logged) == [
        ("book", "step_completed"),
        ("book", "step_completed"),
        ("refuse", "step_failed"),
        ("undo", "step_completed"),
        ("undo", "step_completed"),
    ]
    undone = [e.event.result for e in logged if e.type == "step_completed"][2:]  # type: ignore[union-attr]
    assert undone == ["undid hotel-booked", "undid flight-booked"]
    assert_replays_to_the_same_decisions(app, "trip", logged, result)


async def test_a_saga_that_succeeds_undoes_nothing(make_app: MakeApp) -> None:
    app = _flows(make_app)
    run = await app.start("trip", "none", "serial")
    assert await run.result(timeout=30) == "booked"
    steps = _step_order(await run.events())
    assert steps == [("book", "step_completed")] * 3


async def test_a_failing_compensation_is_retried_then_reported_and_the_rest_run(
    make_app: MakeApp,
) -> None:
    app = _flows(make_app)
    run = await app.start("trip", "car", "broken")
    result = await run.result(timeout=30)
    assert result["error"] == "StepFailed" and "no car available" in result["message"]
    assert result["failed"] == ["broken_undo"]
    logged = await run.events()
    starts = [e.event for e in logged if e.type == "step_started"]
    assert [s.attempt for s in starts if s.step_name == "broken_undo"] == [1, 2]  # type: ignore[union-attr]
    assert _step_order(logged)[-2:] == [("broken_undo", "step_failed"), ("undo", "step_completed")]
    assert_replays_to_the_same_decisions(app, "trip", logged, result)


async def test_continue_on_error_off_stops_at_the_failed_compensation(make_app: MakeApp) -> None:
    app = _flows(make_app)
    run = await app.start("trip", "car", "stop")
    result = await run.result(timeout=30)
    assert result["failed"] == ["broken_undo"]
    assert _step_order(await run.events())[-1] == ("broken_undo", "step_failed")


async def test_reraise_raises_the_original_error_with_a_note(make_app: MakeApp) -> None:
    app = _flows(make_app)
    run = await app.start("trip", "hotel", "reraise")
    result = await run.result(timeout=30)
    assert "no hotel available" in result["reraised"]
    assert result["notes"] == []  # no compensation failed
    assert _step_order(await run.events())[-1] == ("undo", "step_completed")


async def test_parallel_compensations_all_run(make_app: MakeApp) -> None:
    app = _flows(make_app)
    run = await app.start("trip", "car", "parallel")
    result = await run.result(timeout=30)
    assert result["failed"] == []
    completed = [
        e.event.result  # type: ignore[union-attr]
        for e in await run.events()
        if e.type == "step_completed" and e.event.step_name == "undo"  # type: ignore[union-attr]
    ]
    assert sorted(completed) == ["undid flight-booked", "undid hotel-booked"]


@pytest.mark.parametrize(
    ("workflow", "message"),
    [("not_a_step", "a compensation must be a step"), ("bad_args", "Saga.add\\(undo\\)")],
)
async def test_bad_input_to_add_fails_at_the_call(
    make_app: MakeApp, workflow: str, message: str
) -> None:
    app = _flows(make_app)
    run = await app.start(workflow)
    with pytest.raises(Exception, match=message):
        await run.result(timeout=30)
    types = [e.type for e in await run.events()]
    assert not any(t.startswith("step_") for t in types), types


def test_a_saga_outside_workflow_code_is_a_clear_error() -> None:
    with pytest.raises(Exception, match="inside a workflow"):
        Saga().add(print)
    with pytest.raises(TypeError, match="must be a bool"):
        Saga(parallel="yes")  # type: ignore[arg-type]
