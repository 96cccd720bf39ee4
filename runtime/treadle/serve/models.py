"""The JSON the serve API speaks: pydantic models of every request and response body.

``serve.views`` builds the responses from the World's records and events,
``serve.api`` validates requests with them, and ``serve.openapi`` writes the OpenAPI
document from them, so the document cannot drift from what is answered. Times are
ISO 8601 in UTC; values (input, output, payloads) are the log's JSON, encrypted
ones opened where this server holds the key, else ``"<encrypted>"``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from treadle.world import records


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ErrorDetail(_Out):
    code: str = Field(description="Stable machine-readable code, e.g. run_not_found.")
    message: str = Field(description="What is wrong and where, for a person.")


class ErrorResponse(_Out):
    error: ErrorDetail


class RunError(_Out):
    type: str
    message: str
    code: str | None = None
    stack: str | None = None


class LimitWait(_Out):
    """The concurrency or rate limit a run (or one of its steps) waits on (issue 17 item 4)."""

    limit: Literal["concurrency", "rate"]
    scope: str = Field(description="workflow:<name> or step:<name>.")
    key: str
    holder: str = Field(description="The run id, or <run id>/<step id> for a step.")
    priority: int = 0
    position: int | None = Field(default=None, description="1-based among the key's waiters.")
    since: datetime | None = None
    until: datetime | None = Field(default=None, description="A rate's reserved start.")
    text: str


class RunSummary(_Out):
    run_id: str
    workflow: str
    status: records.RunStatus
    deployment_id: str
    spec_version: int
    created_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None
    updated_at: datetime
    duration_ms: int | None = Field(
        default=None, description="From start (or creation) to end; null while it runs."
    )
    attributes: dict[str, JsonValue] = Field(
        default_factory=dict, description="The run's attributes (docs/attributes.md)."
    )
    waiting_on_limit: LimitWait | None = None


class RunList(_Out):
    runs: list[RunSummary]
    next_cursor: str | None = Field(description="Pass as cursor= for the next page; null: done.")


class WaitingOn(_Out):
    """One thing an unfinished run waits on: a running step, a sleep, a hook."""

    kind: Literal["step", "wait", "hook"]
    id: str = Field(description="The correlation id of the step, wait or hook.")
    name: str | None = Field(default=None, description="The step's name.")
    since: datetime
    until: datetime | None = Field(default=None, description="When a sleep is due.")
    attempt: int | None = None
    inline: bool | None = None
    status: str
    token: str | None = Field(
        default=None, description="A hook's token (hidden from the read-only role)."
    )


class ChildOut(_Out):
    """A child workflow run of this run (docs/children.md)."""

    run_id: str
    workflow: str
    correlation_id: str
    on_parent_close: str
    status: str = Field(description="The child's status; 'not created' before it exists.")
    outcome: str | None = Field(
        default=None, description="completed/failed/cancelled once reported to the parent."
    )


class RunDetail(RunSummary):
    input: JsonValue = None
    output: JsonValue = None
    error: RunError | None = None
    attributes: dict[str, JsonValue] = Field(default_factory=dict)
    event_count: int
    waiting_on: list[WaitingOn]
    # Child workflows: this run's parent (a child run) and its children.
    parent_run_id: str | None = None
    parent_correlation_id: str | None = None
    children: list[ChildOut] = Field(default_factory=list)


class EventOut(_Out):
    slot: int
    created_at: datetime
    type: str
    correlation_id: str | None = None
    in_band: bool
    event: dict[str, Any] = Field(description="The whole event as the log holds it.")


class EventList(_Out):
    events: list[EventOut]
    next_cursor: int | None = Field(
        description="Pass as after= for the next page; null: no more now."
    )


class Attempt(_Out):
    attempt: int
    started_at: datetime | None = None
    ended_at: datetime | None = None
    outcome: Literal["running", "completed", "failed", "retrying", "superseded"]
    error: str | None = None


class TimelineBar(_Out):
    id: str = Field(description="The correlation id.")
    kind: Literal["step", "wait", "hook"]
    name: str
    inline: bool
    attempts: list[Attempt]
    start: datetime
    end: datetime | None = None
    status: str


class Timeline(_Out):
    run_id: str
    status: records.RunStatus
    start: datetime
    end: datetime | None = None
    bars: list[TimelineBar]
    refusals: int = Field(
        description="Refusals the log shows: hook tokens the World refused (hook_conflict). "
        "A fence refusal writes nothing, so it shows in /metrics, not here."
    )
    handoffs: int = Field(
        description="Handoffs the log shows: an inline step's retry handed to its own "
        "message, and a step attempt another delivery took over (a new start before "
        "the previous attempt's outcome; that attempt is marked superseded)."
    )


class Deployment(_Out):
    deployment_id: str
    name: str = Field(description="The WorkflowDeployment it is a revision of (or the id).")
    created_at: datetime
    retired: bool
    promoted: bool
    latest: bool
    workflows: list[str]
    active_runs: int = Field(description="Pending and running runs pinned to it (up to 1000).")


class DeploymentGroup(_Out):
    name: str
    latest: str | None = Field(description="Its revision that is the World's latest, if any.")
    revisions: list[str] = Field(description="Newest first.")


class DeploymentList(_Out):
    latest: str | None
    deployments: list[Deployment]
    revisions: list[DeploymentGroup]


class CancelRequest(_In):
    reason: str | None = Field(default=None, max_length=1000)


class WakeRequest(_In):
    waits: list[str] | None = Field(
        default=None, description="Correlation ids of the sleeps to end; null: all of them."
    )


class RerunRequest(_In):
    deployment: Literal["same", "latest"] = Field(
        default="same",
        description="same: the run's own deployment (the latest if it was retired); "
        "latest: the World's latest.",
    )


class ResumeRequest(_In):
    payload: JsonValue = None
    signature: str | None = Field(
        default=None, description="The hook's signature, for a hook that requires one."
    )


class ActionResult(_Out):
    run_id: str
    status: records.RunStatus
    waits: int | None = Field(default=None, description="wake: how many sleeps were asked.")


class RerunResult(_Out):
    run_id: str
    rerun_of: str
    workflow: str
    deployment_id: str


class ResumeResult(_Out):
    run_id: str


class Health(_Out):
    status: Literal["ok"]


class StreamEvent(_Out):
    """The data of one server-sent event: re-read the run (it has events up to slot)."""

    run_id: str
    slot: int


class RunsQuery(_In):
    status: records.RunStatus | None = None
    workflow: str | None = Field(default=None, min_length=1, max_length=500)
    deployment: str | None = Field(default=None, min_length=1, max_length=500)
    q: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Search: a run id, or text in the workflow name, run id or deployment.",
    )
    limit: int = Field(default=50, ge=1, le=500)
    cursor: str | None = Field(default=None, min_length=1, max_length=2000)
    attributes: str | None = Field(
        default=None,
        min_length=2,
        max_length=4000,
        description="Only runs with these attributes: a JSON object of scalars, ANDed "
        '(`{"tier": "gold", "region": "eu"}`; docs/attributes.md).',
    )


class EventsQuery(_In):
    after: int = Field(default=0, ge=0, description="Events after this slot.")
    limit: int = Field(default=500, ge=1, le=1000)


class StreamQuery(_In):
    after: int = Field(default=0, ge=0, description="Report events after this slot.")


class NoQuery(_In):
    """A route that takes no query parameters."""
