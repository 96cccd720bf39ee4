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


@dataclass
class RunView:
    after_slot: int = 0
    created: set[str] = field(default_factory=set)
    started: set[str] = field(default_factory=set)
    completed: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    waits: dict[str, str] = field(default_factory=dict)  # open wait -> resume_at
    hooks: dict[str, str] = field(default_factory=dict)  # open hook -> token

    def apply(self, logged: events.LoggedEvent) -> None:
        if logged.slot <= self.after_slot:
            return
        self.after_slot = logged.slot
        event = logged.event
        key = event.correlation_id or ""
        match event:
            case events.StepCreated():
                self.created.add(key)
            case events.StepStarted():
                self.created.add(key)
                self.started.add(key)
            case events.StepCompleted():
                self.completed.add(key)
            case events.StepFailed():
                self.failed.add(key)
            case events.WaitCreated(resume_at=resume_at):
                self.waits[key] = resume_at.strftime("%Y-%m-%dT%H:%M:%SZ")
            case events.WaitCompleted():
                self.waits.pop(key, None)
            case events.HookCreated(token=token):
                self.hooks[key] = token
            case events.HookReceived() | events.HookDisposed():
                self.hooks.pop(key, None)

    @property
    def steps(self) -> StepCounts:
        ended = self.completed | self.failed
        return StepCounts(
            total=len(self.created),
            completed=len(self.completed),
            failed=len(self.failed),
            running=len(self.started - ended),
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
