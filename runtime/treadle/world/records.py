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
from treadle.world import limitrules

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
    # A child run's parent (child workflows, docs/children.md): the parent run and the
    # correlation id of the parent's child_created.
    parent_run_id: str | None = None
    parent_correlation_id: str | None = None
    # The concurrency or rate limit the run (or one of its steps) waits on: filled by the
    # readers that show it (``limitgate.annotate``), never by a World's ``runs`` (issue 17).
    waiting_on_limit: limitrules.WaitingOn | None = None

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
    # Token retention (issue 17 item 8): the hook's ``token_retention_until``; once its
    # run has ended the token stays reserved (``resume_hook`` answers HookRunEnded).
    retained_until: datetime | None = None


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


# -- schedules (issue 17 item 3: treadle.schedules) ----------------------------------------

ScheduleOverlap: TypeAlias = Literal["skip", "buffer_one", "allow", "cancel_other"]
SCHEDULE_OVERLAPS: tuple[ScheduleOverlap, ...] = ("skip", "buffer_one", "allow", "cancel_other")
# Which of the due firings within the catch-up window fire after a gap (workers down,
# a resume does not count: it catches nothing up): "all" of them (Temporal's rule), or
# only the "latest" (Kubernetes CronJob's rule, for the operator's WorkflowSchedule).
ScheduleCatchup: TypeAlias = Literal["all", "latest"]
SCHEDULE_CATCHUPS: tuple[ScheduleCatchup, ...] = ("all", "latest")


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """What a schedule's author chose (``app.schedule``): checked by ``treadle.schedules``
    before a World stores it. ``input`` is the encoded arguments of every firing's run;
    ``deployment_id``: the deployment its runs start on (and whose workers fire it; None:
    any worker serving the workflow fires it, on its own deployment); ``catchup``: see
    ``ScheduleCatchup``."""

    name: str
    workflow_name: str
    cron: str
    timezone: str
    overlap: ScheduleOverlap
    catchup_window_seconds: float
    input: JsonValue
    paused: bool = False
    deployment_id: str | None = None
    catchup: ScheduleCatchup = "all"


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """Where a schedule's firing stands; replaced whole by ``Schedules.update`` (a claim).

    ``next_fire_at``: the first cron time not yet handled (fired, skipped or missed);
    ``last_fired_at``/``last_run_id``: the latest firing that started a run (the overlap
    policy reads that run's status); ``previous_run_id``: the run before it (a claim under
    ``cancel_other`` cancels it); ``buffered_at``: a firing held by ``buffer_one`` until
    the last run ends; ``skipped``: firings the overlap policy dropped; ``missed``:
    firings older than the catch-up window when their time was handled.
    """

    paused: bool
    next_fire_at: datetime | None
    last_fired_at: datetime | None = None
    last_run_id: str | None = None
    previous_run_id: str | None = None
    buffered_at: datetime | None = None
    skipped: int = 0
    missed: int = 0


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """A stored schedule: its spec, its state, and ``version`` (moved by every write, the
    condition of ``Schedules.update``)."""

    spec: ScheduleSpec
    state: ScheduleState
    version: int
    created_at: datetime
    updated_at: datetime

    @property
    def name(self) -> str:
        return self.spec.name


# -- step heartbeats (issue 17 item 5, docs/timeouts.md) --------------------------------


@dataclass(frozen=True, slots=True)
class HeartbeatRecord:
    """A step's latest stored heartbeat: of its latest attempt that beat, with the
    details ``step_heartbeat()`` gave and when the worker stored it (its clock)."""

    run_id: str
    step_id: str
    attempt: int
    details: JsonValue
    beat_at: datetime


# -- streams (issue 17 item 6, ``contract.Streams``) ----------------------------------------


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One stored chunk: ``index`` its place in the stream (0, 1, ... without gaps),
    ``data`` its serde JSON, and the step attempt that wrote it: ``seq`` is its place
    among that attempt's chunks (0, 1, ... without gaps)."""

    index: int
    data: JsonValue
    step_id: str
    attempt: int
    seq: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class StreamPage:
    """Chunks from an index on, read with the stream's and the run's state in one snapshot:
    ``count`` chunks stored in all, ``closed`` by a writer, ``run_ended`` (terminal: no
    chunk is accepted any more). A reader that read ``count`` chunks of a page that is
    ``closed`` or ``run_ended`` has read the whole stream."""

    chunks: tuple[StreamChunk, ...]
    count: int
    closed: bool
    run_ended: bool


@dataclass(frozen=True, slots=True)
class StreamAppend:
    """What ``streams.append`` stored: ``count`` chunks from ``first_index`` (0 for an
    idempotent retry that stored nothing new: ``replayed``), and whether the stream is
    closed now."""

    first_index: int
    count: int
    closed: bool
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class StreamInfo:
    name: str
    count: int
    closed: bool
