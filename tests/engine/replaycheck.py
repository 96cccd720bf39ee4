"""Replay a finished run's log cold and check it decides what the live run decided
(the "replays identically from its log" of issue 17's "Done when")."""

from __future__ import annotations

from typing import Any

from treadle.replay import engine
from treadle.sdk import functions
from treadle.world import events


def assert_replays_to_the_same_decisions(
    app: Any, name: str, logged: list[events.LoggedEvent], output: Any, *, at_least: int = 4
) -> None:
    """Replay the finished log cold: every prefix that ends before a creation decides
    that creation (same position, step, input), and the whole log completes with the
    same output, deciding nothing new."""
    workflow = app.workflows[name]
    created = logged[0].event
    assert isinstance(created, events.RunCreated)
    run_id = logged[0].run_id

    def replay(upto: int) -> tuple[engine.Outcome, engine.Replay]:
        args, kwargs = functions.decode_arguments(created.input, "input")
        fresh = engine.Replay(
            run_id=run_id, workflow_name=name, workflow=workflow.fn, args=args,
            kwargs=kwargs, created_at=logged[0].created_at,
        )  # fmt: skip
        for event in logged[:upto]:
            fresh.feed(event)
        return fresh.advance(), fresh

    checked = 0
    for index, entry in enumerate(logged):
        event = entry.event
        if not (
            isinstance(event, events.StepCreated | events.HookCreated | events.HookConflict)
            or (isinstance(event, events.StepStarted) and event.inline and event.attempt == 1)
        ):
            continue
        outcome, fresh = replay(index)
        try:
            assert isinstance(outcome, engine.Suspended), (index, outcome)
            decided = {(op.position, op.correlation_id) for op in outcome.new}
            assert (event.position, event.correlation_id) in decided, (index, event)
            checked += 1
        finally:
            fresh.close()
    assert checked >= at_least
    terminal = next(i for i, e in enumerate(logged) if e.type in events.RUN_TERMINAL_TYPES)
    outcome, fresh = replay(terminal)
    try:
        assert isinstance(outcome, engine.Completed) and outcome.value == output
    finally:
        fresh.close()
