"""The event models: every event a run's log can hold, as one discriminated union.

A writer builds an event (``events.StepCompleted(correlation_id=..., ...)``) and
hands it to ``World.events.create``; the World stores it at a slot and returns a
``LoggedEvent`` (slot, time, in-band flag, the event). Payload values (inputs,
results, hook payloads) are already JSON here: the SDK's serializer turns Python
values into JSON before they reach the World.

Which events carry what follows seed 003 ("Step ownership and data", "Spec 9
event rules"): ``inline`` and ``creator_message_id`` on ``step_created``,
``inline`` and the input on an inline step's first ``step_started``,
``creator_message_id`` on ``wait_created``, ``attempt`` on ``step_started``,
``step_retrying``, ``step_failed`` and ``step_completed`` (optional there: a writer of an
earlier release names none), and ``step_name`` on every step event. An outcome names
its attempt so the World refuses one from an attempt a later one superseded
(``storagerules.check_outcome_attempt``).
Creation events also carry the replay ``position`` the workflow code reached.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter

from treadle.world import ids


class ErrorInfo(BaseModel):
    """A failure as the log records it: what the user sees, never a live exception."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    message: str
    type: str = "Error"
    code: str | None = None
    stack: str | None = None


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    correlation_id: str | None = None


class _EntityEvent(_Event):
    """An event about one step, wait or hook: its correlation id is required."""

    correlation_id: str


class RunCreated(_Event):
    type: Literal["run_created"] = "run_created"
    workflow_name: str
    input: JsonValue = None
    deployment_id: str
    spec_version: int
    attributes: dict[str, JsonValue] = Field(default_factory=dict)
    # A child run (child workflows): its parent run and the parent's child_created id.
    parent_run_id: str | None = None
    parent_correlation_id: str | None = None


class RunStarted(_Event):
    type: Literal["run_started"] = "run_started"


class RunCompleted(_Event):
    type: Literal["run_completed"] = "run_completed"
    output: JsonValue = None


class RunFailed(_Event):
    type: Literal["run_failed"] = "run_failed"
    error: ErrorInfo


class RunCancelled(_Event):
    type: Literal["run_cancelled"] = "run_cancelled"
    reason: str | None = None


class StepCreated(_EntityEvent):
    """A background step's creation (an inline step is created by its first start)."""

    type: Literal["step_created"] = "step_created"
    step_name: str
    input: JsonValue = None
    inline: bool = False
    creator_message_id: str | None = None
    position: int | None = None
    max_retries: int | None = None


class StepStarted(_EntityEvent):
    """One attempt's start. An inline step's first start carries its input and creates it."""

    type: Literal["step_started"] = "step_started"
    step_name: str
    attempt: int = Field(ge=1)
    inline: bool = False
    input: JsonValue = None
    position: int | None = None
    max_retries: int | None = None
    # Spec 8 (seed 000): the queue message running an inline body; latest start wins.
    owner_message_id: str | None = None


class StepRetrying(_EntityEvent):
    type: Literal["step_retrying"] = "step_retrying"
    step_name: str
    attempt: int = Field(ge=1)
    error: ErrorInfo
    retry_after: datetime | None = None
    # Set when the orchestrator moves an inline step's retry to the step's own message.
    creator_message_id: str | None = None


class StepCompleted(_EntityEvent):
    type: Literal["step_completed"] = "step_completed"
    step_name: str
    result: JsonValue = None
    # The attempt whose body returned (None: written by an earlier release; unchecked).
    attempt: int | None = Field(default=None, ge=1)


class StepFailed(_EntityEvent):
    type: Literal["step_failed"] = "step_failed"
    step_name: str
    attempt: int = Field(ge=1)
    error: ErrorInfo


class WaitCreated(_EntityEvent):
    type: Literal["wait_created"] = "wait_created"
    resume_at: datetime
    creator_message_id: str | None = None
    position: int | None = None


class WaitCompleted(_EntityEvent):
    type: Literal["wait_completed"] = "wait_completed"


class HookCreated(_EntityEvent):
    type: Literal["hook_created"] = "hook_created"
    token: str = Field(min_length=1)
    metadata: JsonValue = None
    position: int | None = None
    # Hook force-claim and token retention (issue 17 item 8; seed 003 "Force-claim",
    # "Terminal hook disposal"): ``force`` takes the token from the run holding it, and
    # the World records that run in ``claimed_from``; a hook with
    # ``token_retention_until`` keeps its token reserved past its run's end until then.
    force: bool = False
    claimed_from: str | None = None
    token_retention_until: datetime | None = None


class HookReceived(_EntityEvent):
    type: Literal["hook_received"] = "hook_received"
    payload: JsonValue = None


class HookDisposed(_EntityEvent):
    type: Literal["hook_disposed"] = "hook_disposed"
    # Written by the World into the victim's log when another run force-claims the
    # token (the claimer's run id); the victim's await raises HookForceClaimedError.
    force_claimed_by: str | None = None


class HookConflict(_EntityEvent):
    """Written by the World in place of a hook_created whose token a live hook holds."""

    type: Literal["hook_conflict"] = "hook_conflict"
    token: str
    holder_run_id: str | None = None
    position: int | None = None


class AttrSet(_Event):
    """One run attribute set (docs/attributes.md). Written by workflow code in-band, with
    the replay ``position`` it reached and a correlation id ``attr_...`` (replay finds it
    there and never writes it again); by step code or ``run.set_attributes()`` out of
    band, with neither."""

    type: Literal["attr_set"] = "attr_set"
    key: str = Field(min_length=1)
    value: JsonValue = None
    position: int | None = None


class WakeRequested(_Event):
    """``run.wake_up()``: asks the orchestrator to complete waits now (out-of-band).

    ``waits`` names the waits; None means every wait open when it was written.
    Recorded so a wake-up is never lost when its message is coalesced.
    """

    type: Literal["wake_requested"] = "wake_requested"
    waits: list[str] | None = None


class RunRepinned(_Event):
    """The run moved from one deployment to another (``runs.repin``, out-of-band).

    Written only by ``runs.repin``, which moves the run row's ``deployment_id`` in the
    same transaction; replay skips it (it is no workflow operation), ``treadle
    inspect`` shows which code wrote which part of the log.
    """

    type: Literal["run_repinned"] = "run_repinned"
    from_deployment: str
    to_deployment: str
    reason: str | None = None


class Noop(_Event):
    """A sealed slot: holds a position, means nothing."""

    type: Literal["noop"] = "noop"


# -- Child workflows (issue 17 item 1; docs/children.md) ---------------------------------

OnParentClose: TypeAlias = Literal["cancel", "abandon"]


class ChildCreated(_EntityEvent):
    """The parent's decision to start a child run (in-band, at the call's position).

    ``child_run_id`` is derived from the parent run id and this correlation id
    (``treadle.replay.children.child_run_id``), so the run it names is created idempotently
    after the commit, by this delivery or a redelivery.
    """

    type: Literal["child_created"] = "child_created"
    workflow_name: str
    child_run_id: str
    input: JsonValue = None
    position: int | None = None
    on_parent_close: OnParentClose = "cancel"
    start_on_latest: bool = False


class ChildCompleted(_EntityEvent):
    """The child run completed (out-of-band, written once: keyed by the child run id)."""

    type: Literal["child_completed"] = "child_completed"
    child_run_id: str
    output: JsonValue = None


class ChildFailed(_EntityEvent):
    """The child run failed or was cancelled (out-of-band, written once)."""

    type: Literal["child_failed"] = "child_failed"
    child_run_id: str
    error: ErrorInfo
    cancelled: bool = False


CHILD_TYPES: frozenset[str] = frozenset({"child_created", "child_completed", "child_failed"})
CHILD_OUTCOME_TYPES: frozenset[str] = frozenset({"child_completed", "child_failed"})


Event: TypeAlias = Annotated[
    RunCreated
    | RunStarted
    | RunCompleted
    | RunFailed
    | RunCancelled
    | StepCreated
    | StepStarted
    | StepRetrying
    | StepCompleted
    | StepFailed
    | WaitCreated
    | WaitCompleted
    | HookCreated
    | HookReceived
    | HookDisposed
    | HookConflict
    | AttrSet
    | WakeRequested
    | RunRepinned
    | ChildCreated
    | ChildCompleted
    | ChildFailed  # child workflows
    | Noop,
    Field(discriminator="type"),
]

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)

EVENT_TYPES: frozenset[str] = frozenset(
    {
        "run_created",
        "run_started",
        "run_completed",
        "run_failed",
        "run_cancelled",
        "step_created",
        "step_started",
        "step_retrying",
        "step_completed",
        "step_failed",
        "wait_created",
        "wait_completed",
        "hook_created",
        "hook_received",
        "hook_disposed",
        "hook_conflict",
        "attr_set",
        "wake_requested",
        "run_repinned",
        "noop",
    }
    | CHILD_TYPES
)
RUN_TERMINAL_TYPES: frozenset[str] = frozenset({"run_completed", "run_failed", "run_cancelled"})
STEP_OUTCOME_TYPES: frozenset[str] = frozenset({"step_completed", "step_failed"})
STEP_TYPES: frozenset[str] = frozenset(
    {"step_created", "step_started", "step_retrying", "step_completed", "step_failed"}
)
WAIT_TYPES: frozenset[str] = frozenset({"wait_created", "wait_completed"})
# Refused on a terminal run (RunExpired): what would start new work or a new decision,
# and a wake_requested (an ended run has no sleep left to end; client ``wake_up``).
# (A hook_received is not here: the run's end freed its hooks, so it is HookNotFound.)
REFUSED_ON_TERMINAL_RUN: frozenset[str] = frozenset(
    {
        "run_started",
        "run_completed",
        "run_failed",
        "run_cancelled",
        "step_created",
        "step_started",
        "step_retrying",
        "wait_created",
        "hook_created",
        "wake_requested",
        "child_created",  # a child workflow is new work too
    }
)
# Written by a runs operation, never by events.create (WorldContractError there).
WRITTEN_BY_RUNS: frozenset[str] = frozenset({"run_created", "run_repinned"})
# What a create_batch may carry: step and wait events only.
BATCHABLE_TYPES: frozenset[str] = STEP_TYPES | WAIT_TYPES


class Snapshot(BaseModel):
    """The run's counters, read before a listing: highest slot, in-band slots."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq: int = Field(ge=0)
    seq_in_band: int = Field(ge=0)


class LoggedEvent(BaseModel):
    """An event as the log holds it: at a slot, with the time it was stored."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    slot: int = Field(ge=1)
    created_at: datetime
    in_band: bool
    event: Event

    @property
    def event_id(self) -> str:
        return ids.event_id(self.slot)

    @property
    def type(self) -> str:
        return self.event.type

    @property
    def correlation_id(self) -> str | None:
        return self.event.correlation_id


def parse_event(data: Any) -> Event:
    """Validate a dict (or JSON text) as one event; raises pydantic's ValidationError."""
    if isinstance(data, str | bytes):
        return EVENT_ADAPTER.validate_json(data)
    return EVENT_ADAPTER.validate_python(data)
