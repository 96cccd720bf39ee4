"""Every error treadle raises, in one hierarchy.

Callers catch the narrowest class that fits; every class carries the facts a
log line or a user needs (run id, slot, what was expected) as attributes, and
its message names them too::

    TreadleError
    ├── SettingsError                 a bad setting value (names the setting)
    ├── SerializationError            a value cannot cross the event log (names where)
    ├── WorkflowError                 about workflow or step code and its runs
    │   ├── FatalError                raised by a step: fail it now, no retry
    │   ├── RetryableError            raised by a step: retry (after retry_after)
    │   ├── StepFailed                a step's final failure, as the workflow sees it
    │   ├── HookConflictError         another run holds the hook's token
    │   ├── NonDeterministicCall      workflow code did I/O or read real time
    │   ├── CorruptedEventLog         replay kept diverging from the log
    │   ├── DeploymentMismatch        the run's deployment cannot be reached
    │   ├── WorkflowNotFound          no workflow registered under that name
    │   ├── RunFailedError            ``run.result()`` of a run that failed
    │   └── RunCancelledError         ``run.result()`` of a run that was cancelled
    └── WorldError                    the World refused or failed an operation
        ├── InBandSuperseded          fence: a stale expected_seq_in_band; nothing written
        ├── WorldContractError        the caller broke the World contract (a bug, not load)
        ├── RunNotFound               no run with that id
        ├── RunExpired                the run is terminal; the write is refused
        ├── StepAlreadyEnded          a step_started or a second outcome for a step that has one
        ├── WaitAlreadyCompleted      a second wait_completed for one wait
        ├── StepNotFound              no step with that id in the run
        ├── HookNotFound              no live hook with that token
        ├── EarlierItemRefused        a batch item whose correlation id had an earlier refusal
        ├── MessageTooLarge           a queue message over the size limit
        └── StorageUnavailable        the World's storage cannot be opened or used
            ├── StorageLocked         another process holds a local World
            └── IncompatibleStorage   a corrupt, foreign or newer database

Only ``InBandSuperseded`` means "another orchestrator may be writing": the
orchestrator acts on it (stop, send what is owed, redeliver). Every other
refusal leaves the writer's count unchanged.
"""

from __future__ import annotations

from datetime import timedelta


class TreadleError(Exception):
    """Base of every error treadle raises on purpose."""


class SettingsError(TreadleError):
    """A setting has a value treadle cannot use."""


class SerializationError(TreadleError):
    """A value cannot cross the log; ``path`` says which one."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class WorkflowError(TreadleError):
    """About workflow or step code and the runs it makes."""


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


class HookConflictError(WorkflowError):
    """Another run holds this hook's token."""

    def __init__(self, token: str, *, holder_run_id: str | None) -> None:
        super().__init__(f"hook token {token!r} is held by run {holder_run_id}")
        self.token = token
        self.holder_run_id = holder_run_id


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


class WorldError(TreadleError):
    """The World refused or failed an operation."""

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


class InBandSuperseded(WorldError):
    """An in-band write carried a stale count: another writer moved the fence.

    Nothing was allocated or written. The writer must stop for good.
    """

    def __init__(self, run_id: str, *, expected_seq_in_band: int, seq_in_band: int) -> None:
        super().__init__(
            f"run {run_id}: in-band write superseded: it expected seq_in_band "
            f"{expected_seq_in_band} but the run is at {seq_in_band}; nothing was written",
            run_id=run_id,
        )
        self.expected_seq_in_band = expected_seq_in_band
        self.seq_in_band = seq_in_band


class WorldContractError(WorldError):
    """The caller broke the World contract (for example an in-band write without a count)."""

    def __init__(self, message: str, *, run_id: str | None = None, slot: int | None = None) -> None:
        super().__init__(message, run_id=run_id)
        self.slot = slot


class RunNotFound(WorldError):
    """No run with this id exists in the World."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id} not found", run_id=run_id)


class RunExpired(WorldError):
    """The run is terminal, so this event may no longer be written."""

    def __init__(self, run_id: str, *, status: str, event_type: str) -> None:
        super().__init__(
            f"run {run_id} is {status}: a {event_type} event is refused on a terminal run",
            run_id=run_id,
        )
        self.status = status
        self.event_type = event_type


class StepAlreadyEnded(WorldError):
    """A step_started, or a second outcome, for a step whose outcome is already in the log.

    Nothing was allocated or written: the outcome at ``outcome_slot`` stands (another
    delivery's attempt won), so the writer of ``event_type`` has nothing left to do.
    """

    def __init__(
        self, run_id: str, *, step_id: str, outcome_slot: int, event_type: str = "step_started"
    ) -> None:
        super().__init__(
            f"run {run_id}: step {step_id} already has its outcome at slot {outcome_slot}; "
            f"a {event_type} is refused",
            run_id=run_id,
        )
        self.step_id = step_id
        self.outcome_slot = outcome_slot
        self.event_type = event_type


class WaitAlreadyCompleted(WorldError):
    """A second ``wait_completed`` for a wait whose completion is already in the log.

    Nothing was allocated or written; the completion at ``completed_slot`` stands.
    """

    def __init__(self, run_id: str, *, wait_id: str, completed_slot: int) -> None:
        super().__init__(
            f"run {run_id}: wait {wait_id} was completed at slot {completed_slot}; "
            "a second wait_completed is refused",
            run_id=run_id,
        )
        self.wait_id = wait_id
        self.completed_slot = completed_slot


class StepNotFound(WorldError):
    """The run has no step with this id."""

    def __init__(self, run_id: str, *, step_id: str) -> None:
        super().__init__(f"run {run_id} has no step {step_id}", run_id=run_id)
        self.step_id = step_id


class HookNotFound(WorldError):
    """No live hook holds this token (never created, disposed, or its run ended)."""

    def __init__(
        self, token: str | None = None, *, hook_id: str | None = None, run_id: str | None = None
    ) -> None:
        what = f"token {token!r}" if token is not None else f"id {hook_id}"
        where = f" in run {run_id}" if run_id is not None and token is None else ""
        super().__init__(f"no live hook with {what}{where}", run_id=run_id)
        self.token = token
        self.hook_id = hook_id


class EarlierItemRefused(WorldError):
    """A batch item refused because an earlier item with its correlation id was refused."""

    def __init__(self, run_id: str, *, correlation_id: str, index: int) -> None:
        super().__init__(
            f"run {run_id}: batch item {index} refused: an earlier item for "
            f"{correlation_id} was refused",
            run_id=run_id,
        )
        self.correlation_id = correlation_id
        self.index = index


class MessageTooLarge(WorldError):
    """A queue message is larger than the queue accepts."""

    def __init__(self, *, size: int, limit: int, run_id: str | None = None) -> None:
        super().__init__(
            f"queue message of {size} bytes is over the {limit}-byte limit", run_id=run_id
        )
        self.size = size
        self.limit = limit


class StorageUnavailable(WorldError):
    """The World's storage cannot be opened or used."""


class StorageLocked(StorageUnavailable):
    """Another live process holds this local World."""


class IncompatibleStorage(StorageUnavailable):
    """The storage is corrupt, belongs to something else, or has a newer schema."""
