"""A run's progress folded from its events, and the WorkflowRun status made from it.

``RunView`` takes events in slot order, once each (it keeps its cursor), so a
status refresh reads only what is new since the last one. ``status_of`` turns
the run's record plus its view into a ``WorkflowRunStatus``: the log itself
never goes into the object, only counts, what the run waits on (the first 20,
and how many), and a truncated output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

from treadle import payloads
from treadle.world import events, records
from treadle_operator.models import RunError, RunPhase, StepCounts, WorkflowRunStatus
from treadle_operator.runstatus import bound_waiting

OUTPUT_LIMIT = 4096
ERROR_LIMIT = 2048
PHASES: dict[str, RunPhase] = {
    "pending": "Pending",
    "running": "Running",
    "completed": "Completed",
    "failed": "Failed",
    "cancelled": "Cancelled",
}


# Ended step ids a view remembers (to ignore a late duplicate ``step_created``); past
# it only counts are kept. Open steps, sleeps and hooks are kept in full: they are what
# the run is doing now (review R13 "operator memory").
ENDED_REMEMBERED = 1024


@dataclass
class RunView:
    """Counts of a run's steps and its open sleeps and hooks, folded from its events.

    Memory is bounded by what is open: a step is kept by id only until its outcome
    (the World refuses any later start or outcome for it), then it is a count; the
    last ``ENDED_REMEMBERED`` ended ids are kept to ignore a repeated creation.
    """

    after_slot: int = 0
    open_steps: dict[str, bool] = field(default_factory=dict)  # step id -> started
    ended: dict[str, None] = field(default_factory=dict)  # the latest ended step ids
    total: int = 0
    completed: int = 0
    failed: int = 0
    waits: dict[str, str] = field(default_factory=dict)  # open wait -> resume_at
    hooks: dict[str, str] = field(default_factory=dict)  # open hook -> token
    finished: bool = False  # its terminal event is folded in

    def apply(self, logged: events.LoggedEvent) -> None:
        if logged.slot <= self.after_slot:
            return
        self.after_slot = logged.slot
        event = logged.event
        if event.type in events.RUN_TERMINAL_TYPES:
            self.finished = True
        key = event.correlation_id or ""
        match event:
            case events.StepCreated():
                self._open(key, started=False)
            case events.StepStarted():
                self._open(key, started=True)
            case events.StepCompleted():
                if self._end(key):
                    self.completed += 1
            case events.StepFailed():
                if self._end(key):
                    self.failed += 1
            case events.WaitCreated(resume_at=resume_at):
                self.waits[key] = resume_at.strftime("%Y-%m-%dT%H:%M:%SZ")
            case events.WaitCompleted():
                self.waits.pop(key, None)
            case events.HookCreated(token=token):
                self.hooks[key] = token
            case events.HookReceived() | events.HookDisposed():
                self.hooks.pop(key, None)

    def _open(self, key: str, *, started: bool) -> None:
        if key in self.ended:
            return
        if key not in self.open_steps:
            self.total += 1
            self.open_steps[key] = started
        elif started:
            self.open_steps[key] = True

    def _end(self, key: str) -> bool:
        """The step's outcome: forget it but as a count; ``False`` if seen ended already."""
        if key in self.ended:
            return False
        if self.open_steps.pop(key, None) is None:
            self.total += 1  # an outcome with no creation or start seen (not expected)
        self.ended[key] = None
        if len(self.ended) > ENDED_REMEMBERED:
            del self.ended[next(iter(self.ended))]
        return True

    @property
    def steps(self) -> StepCounts:
        return StepCounts(
            total=self.total,
            completed=self.completed,
            failed=self.failed,
            running=sum(1 for started in self.open_steps.values() if started),
        )

    def waiting_on(self) -> list[str]:
        sleeps = [f"sleep until {at}" for at in sorted(self.waits.values())]
        return sleeps + [f"hook {token}" for token in sorted(self.hooks.values())]


def _stamp(moment: datetime | None) -> str | None:
    return None if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 15] + "... (truncated)"


def status_of(
    run: records.RunRecord,
    view: RunView,
    current: WorkflowRunStatus,
    *,
    keys: payloads.KeyRing | None = None,
) -> WorkflowRunStatus:
    """The WorkflowRun status for this run now (what the object already says, updated)."""
    phase = PHASES[run.status]
    steps = view.steps
    output = None
    if run.status == "completed":
        # Encrypted values show as "<encrypted>" unless this operator holds the key.
        shown = payloads.display(run.output, keys)
        output = truncate(json.dumps(shown, separators=(",", ":")), OUTPUT_LIMIT)
    error = None
    if run.error is not None:
        error = RunError(type=run.error.type, message=truncate(run.error.message, ERROR_LIMIT))
    finished = run.is_terminal
    first, count = ([], 0) if finished else bound_waiting(view.waiting_on())
    return current.model_copy(
        update={
            "run_id": run.run_id,
            "revision": run.deployment_id,
            "phase": phase,
            "reason": {"Pending": "Starting", "Running": "Running"}.get(phase, phase),
            "started_at": _stamp(run.started_at or (run.created_at if finished else None)),
            "completed_at": _stamp(run.completed_at or (run.updated_at if finished else None)),
            "steps": steps,
            "steps_summary": f"{steps.completed}/{steps.total}",
            "waiting_on": first,
            "waiting_on_count": count,
            "output": output,
            "error": error,
        }
    )
