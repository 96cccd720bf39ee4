"""Where SDK calls find the run they are in: the replay (workflow code) or the step
being executed (step code). Both are context variables, so concurrent runs and
steps in one process never see each other's.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from treadle import errors
from treadle.replay import engine


@dataclass(frozen=True)
class StepMetadata:
    """What a running step knows about itself."""

    run_id: str
    step_id: str
    step_name: str
    attempt: int
    started_at: datetime
    workflow_name: str
    # The details of the last heartbeat an earlier attempt stored (``step_heartbeat``;
    # steps with a ``heartbeat_timeout``), or None.
    heartbeat_details: Any = None


@dataclass(frozen=True)
class WorkflowMetadata:
    run_id: str
    workflow_name: str
    started_at: datetime


STEP: contextvars.ContextVar[StepMetadata | None] = contextvars.ContextVar(
    "treadle_step", default=None
)


def current_replay() -> engine.Replay | None:
    return engine.CURRENT.get()


def require_replay(call: str) -> engine.Replay:
    replay = engine.CURRENT.get()
    if replay is None:
        raise errors.WorkflowError(f"{call} can only be called inside a workflow function")
    return replay


def step_metadata() -> StepMetadata:
    """The running step's attempt, stable ``step_id`` (an idempotency key) and start time."""
    meta = STEP.get()
    if meta is None:
        raise errors.WorkflowError("step_metadata() can only be called inside a step")
    return meta


def workflow_metadata() -> WorkflowMetadata:
    replay = require_replay("workflow_metadata()")
    return WorkflowMetadata(replay.run_id, replay.workflow_name, replay.started_at)
