"""The WorkflowSchedule custom resource (``wfsched``), as pydantic models.

Cron with a time zone, put in the World as a schedule; each firing's run is shown as a
WorkflowRun (``schedules``, ``schedulesync``, docs/operator-schedules.md). Kept apart
from ``models`` (the other kinds) by size; ``treadle crds`` reads both.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from treadle_operator.models import Condition, WorkflowRunSpec, _Model

ConcurrencyPolicy = Literal["Allow", "Forbid", "Replace"]
# The shape the schema can refuse (a macro, or 5 or 6 fields); the operator checks the rest
# (values, ranges, names) and says what is wrong in the ScheduleValid condition.
SCHEDULE_PATTERN = r"^\s*(@[a-zA-Z]+|[^\s]+(\s+[^\s]+){4,5})\s*$"
TIME_ZONE_PATTERN = r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$"


class WorkflowScheduleSpec(_Model):
    schedule: str = Field(
        min_length=1,
        max_length=512,
        pattern=SCHEDULE_PATTERN,
        description="cron: minute hour day-of-month month day-of-week (an optional leading "
        "seconds field), or @yearly, @monthly, @weekly, @daily, @hourly "
        "(docs/operator-schedules.md)",
    )
    time_zone: str | None = Field(
        default=None,
        max_length=128,
        pattern=TIME_ZONE_PATTERN,
        description="the IANA time zone the schedule is read in (Europe/Paris); UTC if unset",
    )
    concurrency_policy: ConcurrencyPolicy = Field(
        default="Allow",
        description="a firing while an earlier run is active: Allow it, Forbid it (skip), or "
        "Replace the active run (cancelled)",
    )
    starting_deadline_seconds: int | None = Field(
        default=None,
        ge=0,
        description="a firing not started within this many seconds of its time is skipped "
        "(and counted as missed); of the due firings only the latest fires; unset: a year",
    )
    suspend: bool = Field(default=False, description="fire nothing while true")
    successful_runs_history_limit: int = Field(
        default=3, ge=0, le=1000, description="Completed WorkflowRuns to keep"
    )
    failed_runs_history_limit: int = Field(
        default=1, ge=0, le=1000, description="Failed or Cancelled WorkflowRuns to keep"
    )
    run_template: WorkflowRunSpec = Field(
        description="the workflow, input and deployment of each firing's run, and the spec of "
        "the WorkflowRun that shows it"
    )


class ScheduledRunRef(_Model):
    name: str
    uid: str | None = None
    scheduled_time: str | None = Field(default=None, description="the firing it was made for")


class WorkflowScheduleStatus(_Model):
    observed_generation: int | None = None
    world_schedule: str | None = Field(
        default=None, description="the World schedule this object is put as (namespace.name)"
    )
    revision: str | None = Field(
        default=None, description="the deployment revision its runs start on (the latest ready)"
    )
    last_schedule_time: str | None = Field(default=None, description="the latest firing run")
    last_run_id: str | None = Field(default=None, description="the run of the latest firing")
    last_successful_time: str | None = Field(
        default=None, description="when the latest Completed run of this schedule ended"
    )
    next_schedule_time: str | None = Field(default=None, description="the next firing")
    active: list[ScheduledRunRef] = Field(default=[], description="runs that have not ended")
    active_count: int = 0
    missed_schedules: int = Field(
        default=0,
        description="schedule times passed over (workers down, suspended, older than "
        "startingDeadlineSeconds, or before the latest due one), as the World counts them",
    )
    skipped_schedules: int = Field(
        default=0, description="firings skipped because a run was active (Forbid)"
    )
    last_mirrored_time: str | None = Field(
        default=None, description="the latest firing shown as a WorkflowRun (pruned ones stay so)"
    )
    conditions: list[Condition] = Field(default=[])


class WorkflowSchedule(_Model):
    """Schema root: ``spec`` and ``status``."""

    spec: WorkflowScheduleSpec
    status: WorkflowScheduleStatus | None = None
