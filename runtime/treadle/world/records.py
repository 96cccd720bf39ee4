"""What the World returns: write results, log pages and the read views.

Read views (runs, steps, hooks) are folded from the log by the World for the
CLI, the inspector and the operator; the runtime never relies on them for a
decision (it replays the log).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, TypeAlias

from pydantic import JsonValue

from treadle import errors
from treadle.world import events as ev

RunStatus: TypeAlias = Literal["pending", "running", "completed", "failed", "cancelled"]
TERMINAL_RUN_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
StepStatus: TypeAlias = Literal["created", "running", "retrying", "completed", "failed"]


@dataclass(frozen=True, slots=True)
class EventResult:
    """The answer to one ``events.create``.

    ``allocated`` is the number of slots the write took (0 when it converged on
    an event the log already held). ``report`` is the skipped-slot report: every
    event at slots ``event_count + 1 .. event.slot - 1``, in slot order;
    ``has_more`` means it is incomplete and the writer must reload before it
    consumes what this write resolves. Out-of-band writes get no report.
    """

    event: ev.LoggedEvent
    allocated: int
    report: tuple[ev.LoggedEvent, ...] = ()
    has_more: bool = False


@dataclass(frozen=True, slots=True)
class BatchItemResult:
    """One item of a batch: its committed event, or why it was refused."""

    event: ev.LoggedEvent | None = None
    error: errors.WorldError | None = None

    @property
    def ok(self) -> bool:
        return self.event is not None


@dataclass(frozen=True, slots=True)
class BatchResult:
    """The answer to ``events.create_batch``: per-item results, the block's report."""

    items: tuple[BatchItemResult, ...]
    allocated: int
    report: tuple[ev.LoggedEvent, ...] = ()
    has_more: bool = False


@dataclass(frozen=True, slots=True)
class EventPage:
    """One page of a run's log, with the run's counters read before the listing."""

    events: tuple[ev.LoggedEvent, ...]
    snapshot: ev.Snapshot
    has_more: bool
    # Pass as ``after_slot`` for the next page.
    cursor: int


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: str
    workflow_name: str
    status: RunStatus
    deployment_id: str
    spec_version: int
    input: JsonValue
    created_at: datetime
    updated_at: datetime
    seq: int
    seq_in_band: int
    started_at: datetime | None = None
    completed_at: datetime | None = None
    output: JsonValue = None
    error: ev.ErrorInfo | None = None
    attributes: dict[str, JsonValue] = field(default_factory=dict)

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_RUN_STATUSES

    @property
    def snapshot(self) -> ev.Snapshot:
        return ev.Snapshot(seq=self.seq, seq_in_band=self.seq_in_band)


@dataclass(frozen=True, slots=True)
class RunPage:
    runs: tuple[RunRecord, ...]
    # Pass as ``cursor`` for the next page; None on the last one.
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class StepRecord:
    run_id: str
    step_id: str
    step_name: str
    status: StepStatus
    attempt: int
    inline: bool
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None
    retry_after: datetime | None = None
    result: JsonValue = None
    error: ev.ErrorInfo | None = None


@dataclass(frozen=True, slots=True)
class DeploymentRecord:
    """A deployment revision the World has seen: when it first registered, whether retired."""

    deployment_id: str
    created_at: datetime
    retired: bool = False
    # The workflows its workers serve: ``{name: {"params": [...]}}`` (see
    # ``treadle.sdk.functions.catalogue``), as the latest registration recorded it.
    catalogue: JsonValue = None
    # ``Deployments.promote`` named it latest once (review R12).
    promoted: bool = False


@dataclass(frozen=True, slots=True)
class HookRecord:
    """A live hook: its token is held until it is disposed or its run ends."""

    token: str
    run_id: str
    hook_id: str
    created_at: datetime
    metadata: JsonValue = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A queue message moved aside after too many failed deliveries.

    ``kind`` is the message's kind, or ``"unknown"`` for a payload that is not a
    treadle message; ``error`` is the last failure (or why it could not be read).
    """

    message_id: str
    kind: str
    run_id: str | None
    deliveries: int
    error: str
    dead_at: datetime
