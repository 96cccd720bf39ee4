"""Every error treadle raises, in one hierarchy.

Callers catch the narrowest class that fits; every class carries the facts a
log line or a user needs (run id, slot, what was expected) as attributes, and
its message names them too::

    TreadleError
    ├── SettingsError                 a bad setting value (names the setting)
    └── WorldError                    the World refused or failed an operation
        ├── InBandSuperseded          fence: a stale expected_seq_in_band; nothing written
        ├── WorldContractError        the caller broke the World contract (a bug, not load)
        ├── RunNotFound               no run with that id
        ├── RunExpired                the run is terminal; the write is refused
        ├── StepAlreadyEnded          a step_started for a step that already has an outcome
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


class TreadleError(Exception):
    """Base of every error treadle raises on purpose."""


class SettingsError(TreadleError):
    """A setting has a value treadle cannot use."""


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
    """A step_started for a step whose outcome is already in the log."""

    def __init__(self, run_id: str, *, step_id: str, outcome_slot: int) -> None:
        super().__init__(
            f"run {run_id}: step {step_id} already has its outcome at slot {outcome_slot}; "
            "a new step_started is refused",
            run_id=run_id,
        )
        self.step_id = step_id
        self.outcome_slot = outcome_slot


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
