"""What the orchestrator knows of a run's log, folded one event at a time.

Kept incrementally while a delivery absorbs events (never rebuilt per write),
so deciding a step's re-send, a wait's timer or the run's status costs the
same at slot 20 as at slot 20,000. Replay owns the workflow's view; this is
the orchestrator's bookkeeping beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from pydantic import JsonValue

from treadle.orchestrator.childlog import FOLDED as CHILD_FOLDED
from treadle.orchestrator.childlog import ChildLog
from treadle.world import events


@dataclass
class StepState:
    step_id: str
    step_name: str
    inline: bool
    created_at: datetime
    input: JsonValue = None
    max_retries: int | None = None
    creator_message_id: str | None = None
    starts: int = 0
    outcome: str | None = None
    last_type: str = ""
    # The last step_retrying's creator: set when an orchestrator moved this inline step's
    # retry to the step's own message (the step then leaves open_inline_steps for good).
    moved_by: str | None = None
    moved_at: datetime | None = None
    retry_after: datetime | None = None


@dataclass
class WaitState:
    wait_id: str
    resume_at: datetime
    creator_message_id: str | None
    slot: int
    completed: bool = False
    # The run timeout's wait (position -1, ``treadle.runtimeouts``): no wake-up ends it.
    run_deadline: bool = False


@dataclass
class LogState:
    run_id: str
    tail: int = 0
    workflow_name: str = ""
    deployment_id: str | None = None
    # The slot of the last run_repinned: the keys of what is sent since are scoped to it.
    repinned_slot: int | None = None
    spec_version: int = 9
    input: JsonValue = None
    created_at: datetime | None = None
    started: bool = False
    terminal: str | None = None
    steps: dict[str, StepState] = field(default_factory=dict)
    waits: dict[str, WaitState] = field(default_factory=dict)
    open_hooks: set[str] = field(default_factory=set)
    # Kept as the log is folded, so no per-pass question scans every step or wait.
    open_wait_ids: set[str] = field(default_factory=set)
    open_inline_steps: set[str] = field(default_factory=set)
    open_background_steps: set[str] = field(default_factory=set)
    # Wake-ups not yet acted on: (slot written, the waits named or None for all).
    wake_requests: list[tuple[int, list[str] | None]] = field(default_factory=list)
    # Child workflows: the run's parent and children (``orchestrator.childlog``).
    children: ChildLog = field(default_factory=ChildLog)
    # Force-claims in the log: hook id -> (victim run id, creation time) (orchestrator.hookclaims).
    forced_claims: dict[str, tuple[str, datetime]] = field(default_factory=dict)

    def apply(self, logged: events.LoggedEvent) -> None:
        self.tail = max(self.tail, logged.slot)
        at = logged.created_at
        if logged.event.type in CHILD_FOLDED:
            self.children.apply(logged)
        match logged.event:
            case events.RunCreated() as e:
                self.workflow_name, self.deployment_id = e.workflow_name, e.deployment_id
                self.spec_version, self.input, self.created_at = e.spec_version, e.input, at
            case events.RunStarted():
                self.started = True
            case events.RunCompleted() | events.RunFailed() | events.RunCancelled() as e:
                self.terminal = self.terminal or e.type
                self.open_hooks.clear()
            case events.StepCreated() as e:
                self._open_step(e, at, e.creator_message_id)
            case events.StepStarted() as e:
                started = self._open_step(e, at, None)
                if started.outcome is None:
                    started.starts += 1
                    started.last_type = e.type
            case events.StepRetrying() as e:
                step = self.steps.get(e.correlation_id)
                if step is not None and step.outcome is None:
                    step.last_type = e.type
                    step.retry_after = e.retry_after
                    step.moved_by = e.creator_message_id
                    step.moved_at = at if e.creator_message_id else None
                    if e.creator_message_id is not None:
                        # An orchestrator moved this inline step's retry to the step's own
                        # message: from now on that message owns it, like a background
                        # step's, and no orchestrator runs it inline again (seed 003: "never
                        # runs a retried inline step inline again").
                        self.open_inline_steps.discard(e.correlation_id)
                        self.open_background_steps.add(e.correlation_id)
            case events.StepCompleted() | events.StepFailed() as e:
                step = self.steps.get(e.correlation_id)
                if step is not None and step.outcome is None:
                    step.outcome = e.type
                    step.last_type = e.type
                    self.open_inline_steps.discard(e.correlation_id)
                    self.open_background_steps.discard(e.correlation_id)
            case events.WaitCreated() as e:
                if e.correlation_id not in self.waits:
                    self.open_wait_ids.add(e.correlation_id)
                self.waits.setdefault(
                    e.correlation_id,
                    WaitState(
                        e.correlation_id,
                        e.resume_at,
                        e.creator_message_id,
                        logged.slot,
                        run_deadline=e.position == -1,
                    ),
                )
            case events.WaitCompleted() as e:
                wait = self.waits.get(e.correlation_id)
                if wait is not None:
                    wait.completed = True
                    self.open_wait_ids.discard(e.correlation_id)
            case events.HookCreated() as e:
                self.open_hooks.add(e.correlation_id)
                if e.claimed_from is not None:  # a force-claim owing its victim a wake
                    self.forced_claims[e.correlation_id] = (e.claimed_from, at)
            case events.HookDisposed() | events.HookReceived() | events.HookConflict() as e:
                # A hook takes one payload (the World frees its token as it records it).
                self.open_hooks.discard(e.correlation_id)
            case events.WakeRequested() as e:
                self.wake_requests.append((logged.slot, e.waits))
            case events.RunRepinned() as e:
                # The run moved (``runs.repin``): from here on it is the new deployment's.
                self.deployment_id = e.to_deployment
                self.repinned_slot = logged.slot
            case _:
                pass

    def _open_step(
        self, e: events.StepCreated | events.StepStarted, at: datetime, creator: str | None
    ) -> StepState:
        """The step a creation (or an inline step's first start) opens, once."""
        step = self.steps.get(e.correlation_id)
        if step is None:
            opened = self.open_inline_steps if e.inline else self.open_background_steps
            opened.add(e.correlation_id)
            step = StepState(e.correlation_id, e.step_name, e.inline, at, e.input,
                             e.max_retries, creator, last_type=e.type)  # fmt: skip
            self.steps[e.correlation_id] = step
        return step

    def open_waits(self) -> list[WaitState]:
        return [self.waits[w] for w in sorted(self.open_wait_ids)]  # hash-seed free order

    def chain(self, creator_message_id: str | None) -> list[WaitState]:
        """A chain's open waits, earliest first."""
        waits = [w for w in self.open_waits() if w.creator_message_id == creator_message_id]
        return sorted(waits, key=lambda w: (w.resume_at, w.slot))

    def waits_woken(self) -> set[str]:
        """Open waits that a recorded wake-up asked to complete."""
        woken: set[str] = set()
        if not self.wake_requests or not self.open_wait_ids:
            return woken
        for slot, names in self.wake_requests:
            for wait in self.open_waits():
                if wait.run_deadline:
                    continue  # a wake-up ends sleeps, never the run timeout
                if (names is None and wait.slot < slot) or (names and wait.wait_id in names):
                    woken.add(wait.wait_id)
        return woken

    def has_open_background_step(self) -> bool:
        return bool(self.open_background_steps)
