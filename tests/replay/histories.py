"""Golden event-log histories and a live driver, for the replay unit tests.

``Log`` builds a run's log the way the World stores it: slot 1 is
``run_created``, every later slot one ``tick`` after the one before, and each
entity's correlation id is the engine's own (``operations.correlation_id``).
``replay_cold`` replays a finished log in a fresh ``Replay``.

``LiveDriver`` mirrors the orchestrator without a World: it advances a
``Replay``, writes the creation events of ``Suspended.new`` as the
orchestrator would (an inline step's first ``step_started``, ``wait_created``,
``hook_created``), and lets the test append outcomes in the order it chooses.
It remembers every decision with the slot it was made at, so
``assert_cold_agrees`` can replay each prefix of the recorded log cold and
check it decides the same (REPLAY.md, "Results in log order").

Step functions here are ``functions.StepFunction`` built directly; their
bodies only note that they ran, in ``BODY_CALLS``: inside a replay a step's
body never runs, so a test can assert that list stays empty.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

import pydantic

from treadle import serde
from treadle.replay import engine, operations
from treadle.sdk import functions, hooks
from treadle.world import events, ids

RUN_AT_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
START = dt.datetime.fromtimestamp(RUN_AT_MS / 1000, tz=dt.UTC)
TICK = dt.timedelta(seconds=1)
FAR_FUTURE = START + dt.timedelta(days=3650)
FAR_PAST = START - dt.timedelta(days=3650)

Workflow = Callable[..., Awaitable[Any]]

BODY_CALLS: list[str] = []
# Every Replay a helper made, so a test's teardown can close them (as the orchestrator does).
OPENED: list[engine.Replay] = []


class Invoice(pydantic.BaseModel):
    """A step result that crosses the log as a pydantic model."""

    number: str
    total: Decimal
    issued: dt.datetime
    lines: tuple[str, ...]


class Approval(hooks.Hook):
    """A hook payload model."""

    approved: bool
    by: str


def step(name: str, *, max_retries: int = 3) -> functions.StepFunction[..., Any]:
    """A step named ``name`` whose body only records that it ran."""

    async def body(*args: Any, **kwargs: Any) -> Any:
        BODY_CALLS.append(name)
        return None

    return functions.StepFunction(body, name=name, max_retries=max_retries)


def new_run_id(at_ms: int = RUN_AT_MS) -> str:
    return ids.new_run_id(at_ms)


def cid(kind: operations.Kind, run_id: str, position: int) -> str:
    return operations.correlation_id(kind, run_id, position)


class Log:
    """A run's log under construction."""

    def __init__(
        self,
        workflow_name: str = "wf",
        *,
        args: list[Any] | None = None,
        run_id: str | None = None,
        tick: dt.timedelta = TICK,
    ) -> None:
        self.run_id = run_id or new_run_id()
        self.workflow_name = workflow_name
        self.tick = tick
        self.events: list[events.LoggedEvent] = []
        created = events.RunCreated(
            workflow_name=workflow_name,
            input=functions.encode_arguments(tuple(args or []), {}, "workflow"),
            deployment_id="t",
            spec_version=9,
        )
        self.append(created, at=ids.run_created_at(self.run_id))

    @property
    def tail(self) -> int:
        return len(self.events)

    @property
    def last_at(self) -> dt.datetime:
        return self.events[-1].created_at

    def cid(self, kind: operations.Kind, position: int) -> str:
        return cid(kind, self.run_id, position)

    def append(
        self, event: events.Event, *, at: dt.datetime | None = None, in_band: bool = True
    ) -> events.LoggedEvent:
        created_at = at if at is not None else self.last_at + self.tick
        logged = events.LoggedEvent(
            run_id=self.run_id,
            slot=self.tail + 1,
            created_at=created_at,
            in_band=in_band,
            event=event,
        )
        self.events.append(logged)
        return logged

    # -- creations ------------------------------------------------------------------

    def step_started(
        self, position: int, name: str, *, input: Any = None, attempt: int = 1, **kw: Any
    ) -> events.LoggedEvent:
        started = events.StepStarted(
            correlation_id=self.cid("step", position),
            step_name=name,
            attempt=attempt,
            inline=True,
            input=input if input is not None else {"args": [], "kwargs": {}},
            position=position,
        )
        return self.append(started, **kw)

    def wait_created(
        self, position: int, resume_at: dt.datetime = FAR_FUTURE, **kw: Any
    ) -> events.LoggedEvent:
        created = events.WaitCreated(
            correlation_id=self.cid("wait", position), resume_at=resume_at, position=position
        )
        return self.append(created, **kw)

    def hook_created(self, position: int, token: str, **kw: Any) -> events.LoggedEvent:
        created = events.HookCreated(
            correlation_id=self.cid("hook", position), token=token, position=position
        )
        return self.append(created, **kw)

    def hook_conflict(
        self, position: int, token: str, holder: str = "wrun_other", **kw: Any
    ) -> events.LoggedEvent:
        conflict = events.HookConflict(
            correlation_id=self.cid("hook", position),
            token=token,
            holder_run_id=holder,
            position=position,
        )
        return self.append(conflict, **kw)

    def create(self, op: operations.Operation, **kw: Any) -> events.LoggedEvent:
        """The creation event the orchestrator writes for a new operation."""
        if isinstance(op, operations.StepCall):
            started = events.StepStarted(
                correlation_id=op.correlation_id,
                step_name=op.step_name,
                attempt=1,
                inline=True,
                input=op.input,
                position=op.position,
                max_retries=op.max_retries,
            )
            return self.append(started, **kw)
        if isinstance(op, operations.Sleep):
            created = events.WaitCreated(
                correlation_id=op.correlation_id, resume_at=op.resume_at, position=op.position
            )
            return self.append(created, **kw)
        assert isinstance(op, operations.HookWait)
        hook = events.HookCreated(
            correlation_id=op.correlation_id,
            token=op.token,
            metadata=op.metadata,
            position=op.position,
        )
        return self.append(hook, **kw)

    # -- outcomes -------------------------------------------------------------------

    def step_completed(
        self, position: int, name: str, value: Any = None, **kw: Any
    ) -> events.LoggedEvent:
        completed = events.StepCompleted(
            correlation_id=self.cid("step", position), step_name=name, result=serde.encode(value)
        )
        return self.append(completed, in_band=False, **kw)

    def step_failed(
        self, position: int, name: str, message: str, *, error_type: str = "ValueError", **kw: Any
    ) -> events.LoggedEvent:
        failed = events.StepFailed(
            correlation_id=self.cid("step", position),
            step_name=name,
            attempt=1,
            error=events.ErrorInfo(message=message, type=error_type),
        )
        return self.append(failed, in_band=False, **kw)

    def step(self, position: int, name: str, value: Any = None) -> None:
        """A step started and completed, back to back."""
        self.step_started(position, name)
        self.step_completed(position, name, value)

    def wait_completed(self, position: int, **kw: Any) -> events.LoggedEvent:
        completed = events.WaitCompleted(correlation_id=self.cid("wait", position))
        return self.append(completed, in_band=False, **kw)

    def hook_received(self, position: int, payload: Any, **kw: Any) -> events.LoggedEvent:
        received = events.HookReceived(
            correlation_id=self.cid("hook", position), payload=serde.encode(payload)
        )
        return self.append(received, in_band=False, **kw)

    def cancelled(self, reason: str | None = None, **kw: Any) -> events.LoggedEvent:
        return self.append(events.RunCancelled(reason=reason), in_band=False, **kw)


# -- replaying ----------------------------------------------------------------------


def fresh(workflow: Workflow, log: Log, *, upto: int | None = None) -> engine.Replay:
    """A new Replay of ``log``'s run, fed slots 1..``upto`` (all by default)."""
    created = log.events[0].event
    assert isinstance(created, events.RunCreated)
    args, kwargs = functions.decode_arguments(created.input)
    replay = engine.Replay(
        run_id=log.run_id,
        workflow_name=log.workflow_name,
        workflow=workflow,
        args=args,
        kwargs=kwargs,
    )
    OPENED.append(replay)
    for logged in log.events[: log.tail if upto is None else upto]:
        replay.feed(logged)
    return replay


def replay_cold(
    workflow: Workflow, log: Log, *, upto: int | None = None
) -> tuple[engine.Outcome, engine.Replay]:
    """Feed the log (up to a slot) to a fresh Replay and advance it once."""
    replay = fresh(workflow, log, upto=upto)
    return replay.advance(), replay


def describe_op(op: operations.Operation) -> tuple[Any, ...]:
    """An operation as plain, comparable data."""
    detail: Any
    if isinstance(op, operations.StepCall):
        detail = (op.step_name, op.input)
    elif isinstance(op, operations.Sleep):
        detail = op.resume_at
    elif isinstance(op, operations.HookWait):
        detail = op.token
    else:  # pragma: no cover
        detail = None
    return (op.position, op.kind, op.correlation_id, detail)


def summary(outcome: engine.Outcome) -> tuple[Any, ...]:
    """An outcome as plain, comparable data (no live objects)."""
    match outcome:
        case engine.Completed(value=value):
            return ("completed", value)
        case engine.Failed(error=error):
            return ("failed", type(error).__name__, str(error))
        case engine.Suspended(new=new, dispose=dispose):
            return (
                "suspended",
                [describe_op(op) for op in new],
                [op.correlation_id for op in dispose],
            )
        case engine.Diverged() | engine.Ended():
            return ("other", outcome)
    raise AssertionError(f"unknown outcome {outcome!r}")  # pragma: no cover


class LiveDriver:
    """Drives a Replay the way the orchestrator does, recording the log it writes."""

    def __init__(
        self,
        workflow: Workflow,
        *,
        args: list[Any] | None = None,
        run_id: str | None = None,
        tick: dt.timedelta = TICK,
    ) -> None:
        self.workflow = workflow
        self.log = Log(args=args, run_id=run_id, tick=tick)
        self.replay = fresh(workflow, self.log)
        self.decisions: list[tuple[int, tuple[Any, ...]]] = []
        # Tokens live hooks of other runs hold: the World writes hook_conflict for them.
        self.held_tokens: dict[str, str] = {}

    def advance(self) -> engine.Outcome:
        """Advance; on a suspension, write the creation events of its new operations."""
        outcome = self.replay.advance()
        self.decisions.append((self.log.tail, summary(outcome)))
        if isinstance(outcome, engine.Suspended):
            for op in outcome.new:
                holder = self.held_tokens.get(getattr(op, "token", ""))
                if holder is not None:
                    self.replay.feed(self.log.hook_conflict(op.position, op.token, holder))  # type: ignore[attr-defined]
                else:
                    self.replay.feed(self.log.create(op))
        return outcome

    def add(self, logged: events.LoggedEvent) -> None:
        """Feed an event just appended to ``self.log``."""
        assert logged.slot == self.log.tail
        self.replay.feed(logged)

    def complete(self, position: int, name: str, value: Any = None) -> None:
        self.add(self.log.step_completed(position, name, value))

    def fail(self, position: int, name: str, message: str) -> None:
        self.add(self.log.step_failed(position, name, message))

    def wake(self, position: int) -> None:
        self.add(self.log.wait_completed(position))

    def receive(self, position: int, payload: Any) -> None:
        self.add(self.log.hook_received(position, payload))

    def assert_cold_agrees(self) -> None:
        """Every prefix the live replay decided on is decided the same way cold."""
        assert self.decisions, "the driver never advanced"
        for slot, decided in self.decisions:
            outcome, replay = replay_cold(self.workflow, self.log, upto=slot)
            try:
                assert summary(outcome) == decided, f"cold replay of slots 1..{slot} disagrees"
            finally:
                replay.close()
