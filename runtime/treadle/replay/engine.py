"""Replays a workflow against its run's log, one event at a time.

``Replay`` owns a ``WorkflowLoop`` running the workflow coroutine. The
orchestrator ``feed``s it committed events in slot order and calls
``advance``, which runs the loop until nothing is ready, then consumes the
next fed event (the *walk*), and repeats. A result (a step outcome, a
``wait_completed``, a hook payload or conflict) resolves its future only when
the walk reaches it, so races settle in log order on every replay. When the
loop is idle and the walk has nothing left, ``advance`` returns:

- ``Completed`` / ``Failed``: the workflow returned or raised;
- ``Suspended``: what it waits on, with the new operations to write;
- ``Diverged``: the code and the log disagree (position, recorded, reached);
- ``Ended``: the walk reached a terminal run event (a cancel, say).

State is incremental: each fed event is indexed once and walked once, so the
cost of a step does not grow with the log.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random as random_module
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import JsonValue

from treadle import errors, hooktokens, serde
from treadle.replay import operations
from treadle.replay.loop import DurableTimer, WorkflowLoop
from treadle.world import events, ids

log = logging.getLogger("treadle.replay")

CURRENT: contextvars.ContextVar[Replay | None] = contextvars.ContextVar(
    "treadle_replay", default=None
)


class _Divergence(BaseException):
    """Unwinds workflow code at a diverging call; never seen by user code's ``except Exception``."""


class _Closed(BaseException):
    """Unwinds a discarded replay's ``finally:`` blocks at their first durable call."""


@dataclass(frozen=True)
class Completed:
    value: Any


@dataclass(frozen=True)
class Failed:
    error: BaseException


@dataclass(frozen=True)
class Suspended:
    new: list[operations.Operation]
    dispose: list[operations.HookWait] = field(default_factory=list)


@dataclass(frozen=True)
class Diverged:
    position: int
    recorded: str
    reached: str


@dataclass(frozen=True)
class Ended:
    event_type: str


Outcome = Completed | Failed | Suspended | Diverged | Ended


@dataclass(frozen=True)
class _Recorded:
    """A creation event, indexed by position."""

    kind: operations.Kind
    name: str
    correlation_id: str
    slot: int

    def describe(self) -> str:
        return (
            f"step {self.name}"
            if self.kind == "step"
            else (f"hook {self.name!r}" if self.kind == "hook" else "a sleep")
        )


def _name(op: operations.Operation) -> str:
    if isinstance(op, operations.StepCall):
        return op.step_name
    if isinstance(op, operations.HookWait):
        return op.token
    return ""


def _settle(future: asyncio.Future[Any], data: JsonValue, path: str) -> None:
    """Resolve ``future`` with the decoded value; a value that cannot be decoded (a class
    the app does not declare) is raised where the workflow awaits it, on every replay."""
    try:
        value = serde.decode(data, path)
    except errors.SerializationError as exc:
        future.set_exception(exc)
        return
    future.set_result(value)


def _creation(event: events.Event) -> tuple[operations.Kind, str] | None:
    match event:
        case events.StepCreated(step_name=name, position=p) if p is not None:
            return "step", name
        case events.StepStarted(step_name=name, position=p) if p is not None:
            return "step", name
        case events.WaitCreated(position=p) if p is not None:
            return "wait", ""
        case events.HookCreated(token=token, position=p) if p is not None:
            return "hook", token
        case events.HookConflict(token=token, position=p) if p is not None:
            return "hook", token
    return None


class Replay:
    """One replay of one run's workflow, fed its log incrementally."""

    def __init__(
        self,
        *,
        run_id: str,
        workflow_name: str,
        workflow: Callable[..., Awaitable[Any]],
        args: list[Any],
        kwargs: dict[str, Any],
        created_at: datetime | None = None,
    ) -> None:
        self.run_id = run_id
        self.workflow_name = workflow_name
        # The id's time, or for a keyed run id the recorded run_created time.
        self.started_at = ids.clock_origin(run_id, created_at)
        self.loop = WorkflowLoop(self._new_timer, now=self.started_at.timestamp())  # type: ignore[abstract]
        self.random = random_module.Random(run_id)
        self.position = 0
        self.replaying = True
        self.divergence: Diverged | None = None
        self.ended: str | None = None
        self.log_tail = 0  # the highest slot fed
        self._fed: list[events.LoggedEvent] = []
        self._walked = 0
        self._recorded: dict[int, _Recorded] = {}
        self._max_recorded = -1
        self._disposed: set[str] = set()
        self._outcomes: dict[str, events.Event] = {}
        self._ops: dict[str, operations.Operation] = {}
        self._ops_by_position: dict[int, operations.Operation] = {}
        self.closed = False
        self._new: dict[str, operations.Operation] = {}
        self._dispose_requested: list[operations.HookWait] = []
        context = contextvars.copy_context()
        context.run(CURRENT.set, self)
        self.main: asyncio.Task[Any] = self.loop.create_task(
            self._run(workflow, args, kwargs), name=f"workflow {workflow_name}", context=context
        )

    async def _run(
        self, workflow: Callable[..., Awaitable[Any]], args: list[Any], kwargs: dict[str, Any]
    ) -> Any:
        return await workflow(*args, **kwargs)

    # -- the log ---------------------------------------------------------------

    def feed(self, event: events.LoggedEvent) -> None:
        """Take the next committed event; slots must come in order without gaps."""
        if event.slot <= self.log_tail:
            return  # already held (an echo of an own write, or a duplicate push)
        if event.slot != self.log_tail + 1:
            raise errors.WorldContractError(
                f"run {self.run_id}: replay was fed slot {event.slot} after {self.log_tail}",
                run_id=self.run_id,
                slot=event.slot,
            )
        self.log_tail = event.slot
        self._fed.append(event)
        creation = _creation(event.event)
        if creation is not None:
            position = getattr(event.event, "position", None)
            assert isinstance(position, int)
            cid = event.event.correlation_id
            assert cid is not None
            if position not in self._recorded:
                recorded = _Recorded(creation[0], creation[1], cid, event.slot)
                self._recorded[position] = recorded
                self._max_recorded = max(self._max_recorded, position)
                reached = self._ops_by_position.get(position)
                if reached is not None and (reached.kind, _name(reached)) != creation:
                    # Another writer recorded something else where the code already is.
                    self.divergence = Diverged(position, recorded.describe(), reached.describe())
            op = self._new.pop(cid, None)
            if op is not None:
                op.recorded = True
            if isinstance(event.event, events.HookConflict):
                hook = self._ops.get(cid)
                if isinstance(hook, operations.HookWait):
                    hook.conflict_holder = event.event.holder_run_id
                    hook.conflicted = True
        elif isinstance(event.event, events.HookDisposed) and event.event.correlation_id:
            self._disposed.add(event.event.correlation_id)

    @property
    def is_replaying(self) -> bool:
        """The code has not yet reached every operation the log records."""
        return self._max_recorded >= self.position

    @property
    def walk_exhausted(self) -> bool:
        return self._walked >= len(self._fed)

    def _walk_one(self) -> None:
        logged = self._fed[self._walked]
        self._walked += 1
        self.loop.set_time(logged.created_at.timestamp())
        event = logged.event
        if event.type in events.RUN_TERMINAL_TYPES:
            self.ended = event.type
            return
        cid = event.correlation_id
        if cid is None or not isinstance(
            event,
            events.StepCompleted
            | events.StepFailed
            | events.WaitCompleted
            | events.HookReceived
            | events.HookConflict,
        ):
            return
        if isinstance(event, events.HookReceived | events.HookConflict):
            if cid in self._outcomes:
                return  # a hook resolves once
        elif cid in self._outcomes:
            return  # an entity's events after its outcome are inert
        self._outcomes[cid] = event
        op = self._ops.get(cid)
        if op is not None:
            self._resolve(op, event)

    def _resolve(self, op: operations.Operation, event: events.Event) -> None:
        if isinstance(op, operations.StepCall):
            if op.future.done():
                return
            if isinstance(event, events.StepCompleted):
                _settle(op.future, event.result, f"step {op.step_name} result")
            elif isinstance(event, events.StepFailed):
                op.future.set_exception(
                    errors.StepFailed(
                        event.step_name,
                        event.error.message,
                        error_type=event.error.type,
                        code=event.error.code,
                    )
                )
        elif isinstance(op, operations.Sleep):
            if isinstance(event, events.WaitCompleted) and op.timer is not None:
                op.timer.fire()
        elif isinstance(op, operations.HookWait) and not op.future.done():
            if isinstance(event, events.HookReceived):
                _settle(op.future, event.payload, f"hook {op.token!r} payload")
            elif isinstance(event, events.HookConflict):
                op.future.set_exception(
                    errors.HookConflictError(op.token, holder_run_id=event.holder_run_id)
                )

    # -- driving ---------------------------------------------------------------

    def advance(self) -> Outcome:
        """Run and walk until the workflow finishes or waits on what the log lacks."""
        while True:
            self.loop.run_until_idle(stop=lambda: self.divergence is not None)
            if self.divergence is not None:
                return self.divergence
            if self.ended is not None:
                return Ended(self.ended)
            if self.main.done():
                unreached = self._unreached()
                if unreached is not None:
                    return unreached
                if self.main.cancelled():
                    return Failed(asyncio.CancelledError("the workflow was cancelled"))
                exc = self.main.exception()
                return Completed(self.main.result()) if exc is None else Failed(exc)
            if not self.walk_exhausted:
                self._walk_one()
                continue
            self.replaying = False
            unreached = self._unreached()
            if unreached is not None:
                return unreached
            new = [op for op in self._new.values() if not op.cancelled]
            new.sort(key=lambda op: op.position)
            # Hooks in the log to dispose of; a hook disposed in the pass that created it
            # is among ``new`` (``dispose_requested``): its disposal follows its creation.
            # A conflicted hook never held its token: nothing to free.
            dispose = [
                op
                for op in self._dispose_requested
                if op.recorded
                and op.correlation_id not in self._disposed
                and not op.disposed
                and not op.conflicted
            ]
            self._dispose_requested = [op for op in self._dispose_requested if not op.disposed]
            return Suspended(new=new, dispose=dispose)

    def _unreached(self) -> Diverged | None:
        if self._max_recorded < self.position:
            return None
        position = min(p for p in self._recorded if p >= self.position)
        recorded = self._recorded[position]
        state = "returned" if self.main.done() else "stopped waiting"
        return Diverged(position, recorded.describe(), f"the workflow {state} before it")

    def close(self) -> None:
        """Discard the loop: close every task's coroutine now, so no ``finally`` runs later.

        The replay stays current while the coroutines close, marked closed, so a durable
        call in a ``finally:`` unwinds at once instead of running a step body for real.
        """
        self.closed = True
        token = CURRENT.set(self)
        outer = asyncio.events._get_running_loop()
        asyncio.events._set_running_loop(self.loop)
        try:
            for task in list(self.loop.tasks):
                if task.done():
                    continue
                coro = task.get_coro()
                try:
                    coro.close()
                except BaseException as exc:  # user code unwinding; the state is discarded
                    log.debug("run %s: workflow task raised while closing: %r", self.run_id, exc)
        finally:
            asyncio.events._set_running_loop(outer)
            CURRENT.reset(token)
        self.loop.close()

    # -- operations, called by the SDK from workflow code ------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise _Closed()

    def now(self) -> datetime:
        self._check_open()
        self.position += 1
        return datetime.fromtimestamp(self.loop.time(), tz=UTC)

    def next_random(self) -> float:
        self._check_open()
        self.position += 1
        return self.random.random()

    def next_uuid4(self) -> uuid.UUID:
        self._check_open()
        self.position += 1
        return uuid.UUID(int=self.random.getrandbits(128), version=4)

    def _register(self, op: operations.Operation, name: str) -> None:
        recorded = self._recorded.get(op.position)
        if recorded is not None:
            if recorded.kind != op.kind or recorded.name != name:
                self.divergence = Diverged(op.position, recorded.describe(), op.describe())
                raise _Divergence()
            op.correlation_id = recorded.correlation_id
            op.recorded = True
        else:
            self._new[op.correlation_id] = op
        self._ops[op.correlation_id] = op
        self._ops_by_position[op.position] = op
        outcome = self._outcomes.get(op.correlation_id)
        if outcome is not None:
            self._resolve(op, outcome)

    def _take_position(self, kind: operations.Kind) -> tuple[int, str]:
        self._check_open()
        if self.divergence is not None:
            raise _Divergence()
        position = self.position
        self.position += 1
        return position, operations.correlation_id(kind, self.run_id, position)

    def call_step(
        self,
        step_name: str,
        input: JsonValue,
        *,
        max_retries: int,
        input_error: str | None = None,
    ) -> asyncio.Future[Any]:
        position, cid = self._take_position("step")
        op = operations.StepCall(
            position,
            cid,
            step_name=step_name,
            input=input,
            max_retries=max_retries,
            input_error=input_error,
            future=self.loop.create_future(),
        )
        self._register(op, step_name)
        return op.future

    def _new_timer(self, when: float, handle: DurableTimer) -> None:
        position, cid = self._take_position("wait")
        resume_at = datetime.fromtimestamp(when, tz=UTC)
        op = operations.Sleep(position, cid, resume_at=resume_at, timer=handle)
        handle.on_cancel = lambda: self._cancel(op)
        self._register(op, "")

    def _cancel(self, op: operations.Operation) -> None:
        op.cancelled = True
        self._new.pop(op.correlation_id, None)

    def create_hook(
        self, token: str | None, metadata: JsonValue, *, namespace: str | None = None
    ) -> operations.HookWait:
        """A hook at the next position; ``token`` None mints one, or takes the log's."""
        position, cid = self._take_position("hook")
        recorded_at = self._recorded.get(position)
        token = hooktokens.resolve(
            token,
            namespace,
            recorded_at.name if recorded_at is not None and recorded_at.kind == "hook" else None,
        )
        op = operations.HookWait(
            position, cid, token=token, metadata=metadata, future=self.loop.create_future()
        )
        self._register(op, token)
        if op.recorded:
            recorded = self._recorded[position]
            conflict = self._fed[recorded.slot - 1].event
            if isinstance(conflict, events.HookConflict):
                op.conflicted = True
                op.conflict_holder = conflict.holder_run_id
        return op

    def recorded_hook_metadata(self, op: operations.HookWait) -> JsonValue:
        """The metadata the log recorded for ``op``'s hook (None before it is recorded):
        a webhook's URL is taken from there on replay, like its token."""
        recorded = self._recorded.get(op.position)
        if recorded is None or recorded.kind != "hook":
            return None
        event = self._fed[recorded.slot - 1].event
        return event.metadata if isinstance(event, events.HookCreated) else None

    def dispose_hook(self, op: operations.HookWait) -> None:
        op.dispose_requested = True
        self._dispose_requested.append(op)
