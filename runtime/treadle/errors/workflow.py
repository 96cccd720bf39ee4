"""``WorkflowError``'s core family: about workflow or step code and its runs.

What a step raises (``FatalError``, ``RetryableError``), what the workflow sees of a
step's failure (``StepFailed``), replay's refusals (``NonDeterministicCall``,
``CorruptedEventLog``), finding the code (``DeploymentMismatch``, ``WorkflowNotFound``,
``RunNotMovable``) and ``run.result()``'s answers (``RunFailedError``,
``RunCancelledError``). The feature errors of issue 17 are in ``errors.features``.
"""

from __future__ import annotations

from datetime import timedelta

from treadle.errors.base import WorkflowError


class FatalError(WorkflowError):
    """Raise in a step to fail it at once, without retries."""


class RetryableError(WorkflowError):
    """Raise in a step to retry it, after ``retry_after`` (seconds or timedelta) if given."""

    def __init__(self, message: str = "", *, retry_after: float | timedelta | None = None) -> None:
        super().__init__(message)
        if isinstance(retry_after, timedelta):
            retry_after = retry_after.total_seconds()
        if retry_after is not None and not retry_after >= 0:
            raise ValueError(f"retry_after must be >= 0 seconds, got {retry_after}")
        self.retry_after: float | None = retry_after


class StepFailed(WorkflowError):
    """A step failed for good; awaiting it in a workflow raises this."""

    def __init__(
        self, step_name: str, message: str, *, error_type: str = "Error", code: str | None = None
    ) -> None:
        super().__init__(f"step {step_name} failed: {error_type}: {message}")
        self.step_name = step_name
        self.error_message = message
        self.error_type = error_type
        self.code = code


class NonDeterministicCall(WorkflowError):
    """Workflow code called something that needs real I/O or real time."""

    def __init__(self, call: str) -> None:
        super().__init__(
            f"{call} is not allowed in workflow code: it is not deterministic on replay; "
            "do it in a step"
        )
        self.call = call


class CorruptedEventLog(WorkflowError):
    """Replay kept diverging from the run's log; names the position and the mismatch."""

    def __init__(self, run_id: str, *, position: int, recorded: str, reached: str) -> None:
        super().__init__(
            f"run {run_id}: the workflow diverged from its event log at position {position}: "
            f"the log records {recorded}, the code reached {reached}"
        )
        self.run_id = run_id
        self.position = position
        self.recorded = recorded
        self.reached = reached


class DeploymentMismatch(WorkflowError):
    """The run's pinned deployment cannot be reached."""


class WorkflowNotFound(WorkflowError):
    """No workflow is registered under this name."""


class RunNotMovable(WorkflowError):
    """A run cannot be moved to another revision: its workflow does not declare the same
    compatibility tag in both revisions' catalogues (``@app.workflow(compatible=...)``).
    Nothing was written."""

    def __init__(self, run_id: str, *, workflow: str, reason: str) -> None:
        super().__init__(f"run {run_id} ({workflow}) is not moved: {reason}")
        self.run_id = run_id
        self.workflow = workflow
        self.reason = reason


class RunFailedError(WorkflowError):
    """The run failed; ``error_type`` and ``error_message`` are what it recorded."""

    def __init__(self, run_id: str, message: str, *, error_type: str = "Error") -> None:
        super().__init__(f"run {run_id} failed: {error_type}: {message}")
        self.run_id = run_id
        self.error_message = message
        self.error_type = error_type


class RunCancelledError(WorkflowError):
    """The run was cancelled."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id} was cancelled")
        self.run_id = run_id
