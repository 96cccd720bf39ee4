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
cost of a step does not grow with the log. Indexing reads the creation an event
records (``replay.creations``); walking resolves the operation a result settles
(``replay.results``).
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

from treadle import errors, hooktokens
from treadle.replay import children, creations, operations, results
from treadle.replay.loop import DurableTimer, WorkflowLoop
from treadle.world import constants, events, ids

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
        spec_version: int | None = None,
        run_timeout: float | None = None,
    ) -> None:
        self.run_id = run_id
        self.spec_version = spec_version
        # set_attributes() calls not yet in the log, by correlation id, in call order.
        self.pending_attributes: dict[str, operations.AttrWrite] = {}
        self.workflow_name = workflow_name
        self.spec_version = 9  # set by a spec 8 delivery (spec 9 only features refuse)
        self.finished = False  # the workflow returned or raised (advance said so)
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
        self._recorded: dict[int, creations.Recorded] = {}
        self._max_recorded = -1
        self._disposed: set[str] = set()
        self._outcomes: dict[str, events.Event] = {}
        self._ops: dict[str, operations.Operation] = {}
        self._ops_by_position: dict[int, operations.Operation] = {}
        self.closed = False
        self._new: dict[str, operations.Operation] = {}
        # Set by the orchestrator: what children this replay may start (None: none).
        self.child_scope: operations.ChildScope | None = None
        self._dispose_requested: list[operations.HookWait] = []
        # The run timeout (``treadle.runtimeouts``): a wait at position -1, set when reached.
        self.timed_out: errors.RunTimedOut | None = None
        self._deadline: operations.RunDeadline | None = None
        if run_timeout is not None:
            self._arm_deadline(run_timeout)
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
        creation = creations.creation(event.event)
        if creation is not None:
            position = getattr(event.event, "position", None)
            assert isinstance(position, int)
            cid = event.event.correlation_id
            assert cid is not None
            if position not in self._recorded:
                recorded = creations.Recorded(creation[0], creation[1], cid, event.slot)
                self._recorded[position] = recorded
                self._max_recorded = max(self._max_recorded, position)
                reached = self._ops_by_position.get(position)
                if reached is not None and (reached.kind, creations.name_of(reached)) != creation:
                    # Another writer recorded something else where the code already is.
                    self.divergence = Diverged(position, recorded.describe(), reached.describe())
            op = self._new.pop(cid, None) or self.pending_attributes.pop(cid, None)
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

    @property
    def at_rest(self) -> bool:
        """Suspended (the loop idle) with every operation it reached recorded, neither
        diverged nor ended: what a warm session may keep and continue later with more
        events (``orchestrator.warm``). Events fed and not walked yet are walked by the
        next ``advance`` exactly as a fresh replay of the same log would walk them."""
        return (
            not self.closed
            and self.divergence is None
            and self.ended is None
            and not self.main.done()
            and self.loop.idle
            and not any(not op.cancelled for op in self._new.values())
        )

    def _walk_one(self) -> None:
        logged = self._fed[self._walked]
        if self._past_deadline(logged):
            return  # not consumed: the run timed out first (``advance`` answers Failed)
        self._walked += 1
        self.loop.set_time(logged.created_at.timestamp())
        event = logged.event
        if event.type in events.RUN_TERMINAL_TYPES:
            self.ended = event.type
            return
        cid = event.correlation_id
        forced = isinstance(event, events.HookDisposed) and event.force_claimed_by is not None
        if cid is None or not (
            forced
            or isinstance(
                event,
                events.StepCompleted
                | events.StepFailed
                | events.WaitCompleted
                | events.HookReceived
                | events.HookConflict
                | events.ChildCompleted
                | events.ChildFailed,
            )
        ):
            return
        if forced or isinstance(event, events.HookReceived | events.HookConflict):
            if cid in self._outcomes:
                return  # a hook resolves once
        elif cid in self._outcomes:
            return  # an entity's events after its outcome are inert
        self._outcomes[cid] = event
        op = self._ops.get(cid)
        if op is not None:
            self._resolve(op, event)

    def _resolve(self, op: operations.Operation, event: events.Event) -> None:
        if isinstance(op, operations.RunDeadline):
            if isinstance(event, events.WaitCompleted):
                self.timed_out = errors.RunTimedOut(self.run_id, seconds=op.seconds)
            return
        results.resolve(op, event)

    # -- driving ---------------------------------------------------------------

    def advance(self) -> Outcome:
        """Run and walk until the workflow finishes or waits on what the log lacks."""
        while True:
            self.loop.run_until_idle(stop=lambda: self.divergence is not None)
            if self.divergence is not None:
                return self.divergence
            if self.ended is not None:
                return Ended(self.ended)
            if self.timed_out is not None:
                return Failed(self.timed_out)
            if self.main.done():
                unreached = self._unreached()
                if unreached is not None:
                    return unreached
                self.finished = True
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
        background: bool = False,
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
            background=background,
        )
        self._register(op, step_name)
        return op.future

    def _new_timer(self, when: float, handle: DurableTimer) -> None:
        position, cid = self._take_position("wait")
        resume_at = datetime.fromtimestamp(when, tz=UTC)
        op = operations.Sleep(position, cid, resume_at=resume_at, timer=handle)
        handle.on_cancel = lambda: self._cancel(op)
        self._register(op, "")

    def _past_deadline(self, logged: events.LoggedEvent) -> bool:
        """The run timeout reached by time: an event stored at or after the deadline is
        walked only after it, so a run never goes on past its deadline even when the
        deadline's own ``wait_completed`` comes late (a delayed timer), on every replay
        (the times are the log's). A terminal event still ends the walk as it is."""
        deadline = self._deadline
        if deadline is None or self.timed_out is not None:
            return False
        if logged.created_at < deadline.resume_at or logged.type in events.RUN_TERMINAL_TYPES:
            return False
        self.timed_out = errors.RunTimedOut(self.run_id, seconds=deadline.seconds)
        return True

    def _arm_deadline(self, seconds: float) -> None:
        """The run timeout as a wait at position -1: outside the code's positions, so
        adding it shifts nothing, and the same on every replay (its value is the log's)."""
        cid = operations.correlation_id("wait", self.run_id, -1)
        resume_at = datetime.fromtimestamp(self.started_at.timestamp() + seconds, tz=UTC)
        op = operations.RunDeadline(-1, cid, resume_at=resume_at, seconds=seconds)
        self._deadline = op
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

    def set_attributes(self, values: dict[str, JsonValue]) -> None:
        """``set_attributes()`` in workflow code: a position per key, in the mapping's
        order. A key the log records at its position is replayed (never written again;
        the log's value stands); a new one waits in ``pending_attributes`` for the
        orchestrator's in-band write. A spec 8 run refuses it (``AttributesNeedSpec9``)."""
        if (
            self.spec_version is not None
            and self.spec_version < constants.SPEC_VERSION_SINGLE_ORCHESTRATOR
        ):
            raise errors.AttributesNeedSpec9(self.run_id, self.spec_version)
        for key, value in values.items():
            position, cid = self._take_position("attr")
            op = operations.AttrWrite(position, cid, key=key, value=value)
            recorded = self._recorded.get(position)
            if recorded is not None:
                if recorded.kind != "attr" or recorded.name != key:
                    self.divergence = Diverged(position, recorded.describe(), op.describe())
                    raise _Divergence()
                op.correlation_id = recorded.correlation_id
                op.recorded = True
            else:
                self.pending_attributes[cid] = op
            self._ops_by_position[position] = op

    def terminal_hooks(self) -> Suspended:
        """At the run's end: the hooks created in the last pass and the disposals asked for
        and not written (``orchestrator.hookdrain`` picks what the terminal drain writes)."""
        new = [
            op
            for op in self._new.values()
            if isinstance(op, operations.HookWait) and not op.cancelled
        ]
        dispose = [
            op
            for op in self._dispose_requested
            if op.recorded
            and op.correlation_id not in self._disposed
            and not op.disposed
            and not op.conflicted
        ]
        return Suspended(new=sorted(new, key=lambda op: op.position), dispose=dispose)

    def dispose_hook(self, op: operations.HookWait) -> None:
        op.dispose_requested = True
        self._dispose_requested.append(op)

    def call_child(
        self,
        workflow_name: str,
        input: JsonValue,
        *,
        on_parent_close: events.OnParentClose,
        start_on_latest: bool,
    ) -> operations.ChildCall:
        """A child run at the next position (``treadle.replay.children``); an unknown
        workflow or a spec 8 run is refused here, before a position is taken."""
        children.check_call(self, workflow_name)
        position, cid = self._take_position("child")
        op = operations.ChildCall(
            position,
            cid,
            workflow_name=workflow_name,
            input=input,
            child_run_id=children.child_run_id(self.run_id, cid),
            on_parent_close=on_parent_close,
            start_on_latest=start_on_latest,
            future=self.loop.create_future(),
        )
        self._register(op, workflow_name)
        return op

    def unwritten_children(self) -> list[operations.ChildCall]:
        """Child calls the workflow made that the log does not hold yet, in call order
        (the orchestrator writes them before a run's end: ``orchestrator.children``)."""
        calls = [op for op in self._new.values() if isinstance(op, operations.ChildCall)]
        return sorted(calls, key=lambda op: op.position)
