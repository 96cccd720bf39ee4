"""WorkflowSchedule rules: when to fire, what a firing makes, what to skip, count and prune.

Pure (no I/O): ``scheduler`` reads the schedule and the WorkflowRuns it made, calls
``plan`` with the time, acts on the ``Plan`` (cancel, create, delete), then writes
``status_of``. tests/operator/test_schedules.py pins every rule here with explicit
times; docs/operator-schedules.md states them for users. They are Kubernetes
CronJob's (its v2 controller), with the run key making firings idempotent:

- The firing considered is the *most recent* schedule time in (``lastScheduleTime``
  or the object's creation, now]. Older ones are not run: after downtime a schedule
  fires once, not once per missed time; the rest (less those that have a run) are
  counted in ``missedSchedules``
  (CronJob counts to 100: past that the count reads 101, a Warning Event
  ``TooManyMissedTimes`` is posted, and the latest still fires, as CronJob v2 does).
- It is skipped while ``suspend`` is true; when ``startingDeadlineSeconds`` is set
  and it is older than that (``DeadlineExceeded``); and under ``Forbid`` while a run
  of this schedule is active. Skipping does not advance ``lastScheduleTime``, so, as
  with CronJob, a firing skipped by Forbid or suspend still fires when the run ends
  (or on resume) if it is then still the latest and within the deadline: set
  ``startingDeadlineSeconds`` to make those skips final.
- ``Replace`` cancels the active runs (their ``spec.cancel``), then fires.
- A firing is a WorkflowRun ``<schedule>-<unix seconds of the schedule time>`` whose
  ``spec.runKey`` is that time (ISO 8601, UTC): the same firing made twice (an
  operator restarted between creating the run and writing status) is the same name
  and the same run id, never a second run. A run of the schedule that already exists
  for the firing time is that firing (nothing is cancelled or forbidden because of it).
- History: finished runs beyond ``successfulRunsHistoryLimit`` (Completed) and
  ``failedRunsHistoryLimit`` (Failed or Cancelled) are deleted, oldest first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from treadle_operator import models
from treadle_operator.conditions import condition, merge_conditions
from treadle_operator.cron import Cron
from treadle_operator.schedulemodels import (
    ScheduledRunRef,
    WorkflowScheduleSpec,
    WorkflowScheduleStatus,
)

PLURAL = "workflowschedules"
KIND = "WorkflowSchedule"
LABEL = "treadle.dev/schedule"
SCHEDULED_TIME = "treadle.dev/scheduled-time"
MAX_NAME = 52  # as CronJob: the name, "-" and ten digits of unix time fit a label value
MANY_MISSED = 100
_STAMP = "%Y-%m-%dT%H:%M:%SZ"


def stamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime(_STAMP)


def parse_stamp(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.strptime(text, _STAMP).replace(tzinfo=UTC)
    except ValueError:
        return None


@dataclass(frozen=True)
class ScheduledRun:
    """A WorkflowRun this schedule made, as listed."""

    name: str
    uid: str
    scheduled: datetime
    phase: str
    completed_at: datetime | None = None
    cancel_requested: bool = False

    @property
    def finished(self) -> bool:
        return self.phase in models.FINISHED_PHASES


def scheduled_run(body: dict[str, Any]) -> ScheduledRun | None:
    """A listed WorkflowRun as a ``ScheduledRun`` (``None``: it carries no schedule time)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    at = parse_stamp((meta.get("annotations") or {}).get(SCHEDULED_TIME)) or parse_stamp(
        spec.get("runKey")
    )
    if at is None:
        return None
    return ScheduledRun(
        name=str(meta.get("name")),
        uid=str(meta.get("uid")),
        scheduled=at,
        phase=str(status.get("phase") or "Pending"),
        completed_at=parse_stamp(status.get("completedAt")),
        cancel_requested=bool(spec.get("cancel")),
    )


def owned_by(body: dict[str, Any], uid: str) -> bool:
    """The object names the schedule of ``uid`` as its controller."""
    refs = (body.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid and r.get("kind") == KIND for r in refs)


@dataclass(frozen=True)
class Plan:
    """What to do now."""

    fire: datetime | None  # the firing to make (or adopt) a run for
    replace: tuple[str, ...]  # active runs to cancel before firing (Replace)
    prune: tuple[str, ...]  # finished runs past the history limits
    missed: int  # schedule times passed over; MANY_MISSED + 1: more than MANY_MISSED
    skipped: str | None  # why the latest time did not fire: Suspended, DeadlineExceeded, Forbid
    skipped_time: datetime | None
    next_time: datetime | None
    active: tuple[ScheduledRun, ...]
    last_successful: datetime | None


def plan(
    spec: WorkflowScheduleSpec,
    cron: Cron,
    *,
    last_schedule: datetime | None,
    created: datetime,
    runs: Sequence[ScheduledRun],
    now: datetime,
) -> Plan:
    """The schedule's next move at ``now``, from its spec, status and runs."""
    latest, count = cron.latest(last_schedule or created, now, MANY_MISSED)
    made = {r.scheduled: r for r in runs}
    active = [r for r in runs if not r.finished]
    fire: datetime | None = None
    skipped: str | None = None
    missed = count
    if latest is not None:
        already = latest in made
        late = (now - latest).total_seconds()
        deadline = spec.starting_deadline_seconds
        if already:
            fire = latest  # made before a restart (status unwritten): that is the firing
        elif spec.suspend:
            skipped = "Suspended"
        elif deadline is not None and late > deadline:
            skipped = "DeadlineExceeded"
        elif spec.concurrency_policy == "Forbid" and active:
            skipped = "Forbid"
        else:
            fire = latest
        if count <= MANY_MISSED:  # times that have a run (made before a restart) ran
            origin = last_schedule or created
            ran = sum(1 for t in made if origin < t < latest)
            missed = max(0, count - ran - (1 if fire is not None else 0))
    if spec.suspend and fire is None:
        skipped = "Suspended"  # with or without a time passed over
    replace: tuple[str, ...] = ()
    if fire is not None and fire not in made and spec.concurrency_policy == "Replace":
        replace = tuple(r.name for r in active if not r.cancel_requested)
    completed = [r.completed_at or r.scheduled for r in runs if r.phase == "Completed"]
    return Plan(
        fire=fire,
        replace=replace,
        prune=prune(runs, spec.successful_runs_history_limit, spec.failed_runs_history_limit),
        missed=missed,
        skipped=skipped,
        skipped_time=latest if skipped else None,
        next_time=None if spec.suspend else cron.next_after(now),
        active=tuple(sorted(active, key=lambda r: r.scheduled)),
        last_successful=max(completed, default=None),
    )


def prune(runs: Iterable[ScheduledRun], successful: int, failed: int) -> tuple[str, ...]:
    """Finished runs past the limits, oldest first (Completed; Failed or Cancelled)."""
    newest = sorted((r for r in runs if r.finished), key=lambda r: r.scheduled, reverse=True)
    good = [r for r in newest if r.phase == "Completed"]
    bad = [r for r in newest if r.phase != "Completed"]
    gone = good[successful:] + bad[failed:]
    return tuple(r.name for r in sorted(gone, key=lambda r: r.scheduled))


def run_name(schedule: str, at: datetime) -> str:
    """The WorkflowRun of a firing: ``<schedule>-<unix seconds>``, as CronJob names Jobs."""
    return f"{schedule}-{int(at.timestamp())}"


def run_body(schedule: dict[str, Any], at: datetime) -> dict[str, Any]:
    """The WorkflowRun a firing at ``at`` makes: the run template, keyed by the time."""
    meta = schedule["metadata"]
    template = dict((schedule.get("spec") or {}).get("runTemplate") or {})
    template.pop("cancel", None)
    template["runKey"] = stamp(at)
    return {
        "apiVersion": models.API_VERSION,
        "kind": "WorkflowRun",
        "metadata": {
            "name": run_name(meta["name"], at),
            "namespace": meta["namespace"],
            "labels": {LABEL: meta["name"]},
            "annotations": {SCHEDULED_TIME: stamp(at)},
            "ownerReferences": [
                {
                    "apiVersion": models.API_VERSION,
                    "kind": KIND,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": template,
    }


def name_problem(name: str) -> str | None:
    if len(name) > MAX_NAME:
        return (
            f"metadata.name: {name!r} is {len(name)} characters; a WorkflowSchedule's name "
            f"is at most {MAX_NAME} (its runs are <name>-<unix time>, and it is a label value)"
        )
    return None


def status_of(
    previous: WorkflowScheduleStatus,
    generation: int | None,
    *,
    plan: Plan | None,
    last_schedule: datetime | None,
    problem: tuple[str, str] | None = None,
    refused: str | None = None,
) -> WorkflowScheduleStatus:
    """The status to write. ``problem``: (reason, message) of an unusable spec; ``refused``:
    why the API server refused the latest firing's WorkflowRun."""
    if problem is not None or plan is None:
        reason, message = problem or ("InvalidSchedule", "the schedule cannot be used")
        wanted = [
            condition("Ready", False, reason, message),
            condition("ScheduleValid", False, reason, message),
            condition("Stalled", True, reason, message),
        ]
        return previous.model_copy(
            update={
                "observed_generation": generation,
                "next_schedule_time": None,
                "conditions": _observed(merge_conditions(previous.conditions, wanted), generation),
            }
        )
    if refused is not None:
        ready = condition("Ready", False, "RunRefused", refused)
    elif plan.skipped == "Suspended":
        ready = condition("Ready", True, "Suspended", "spec.suspend is true: nothing fires")
    else:
        nxt = f"next at {stamp(plan.next_time)}" if plan.next_time else "it never fires again"
        ready = condition("Ready", True, "Scheduled", nxt)
    wanted = [
        ready,
        condition("ScheduleValid", True, "Valid", ""),
        condition("Stalled", False, "Valid", ""),
    ]
    prior_success = parse_stamp(previous.last_successful_time)
    success = max((t for t in (prior_success, plan.last_successful) if t), default=None)
    return previous.model_copy(
        update={
            "observed_generation": generation,
            "last_schedule_time": stamp(last_schedule) if last_schedule else None,
            "last_successful_time": stamp(success) if success else None,
            "next_schedule_time": stamp(plan.next_time) if plan.next_time else None,
            "active": [
                ScheduledRunRef(name=r.name, uid=r.uid, scheduled_time=stamp(r.scheduled))
                for r in plan.active
            ],
            "active_count": len(plan.active),
            "missed_schedules": plan.missed,
            "conditions": _observed(merge_conditions(previous.conditions, wanted), generation),
        }
    )


def _observed(conditions: list[models.Condition], generation: int | None) -> list[Any]:
    return [c.model_copy(update={"observed_generation": generation}) for c in conditions]


def wake_in(next_time: datetime | None, now: datetime, cap: float) -> float | None:
    """Seconds to sleep before the next firing (at most ``cap``, to absorb wall-clock
    steps); ``None``: no firing to wait for, only changes."""
    if next_time is None:
        return None
    return max(0.0, min(cap, (next_time - now).total_seconds() + 0.005))


def after_firing(active: Sequence[ScheduledRun], made: ScheduledRun) -> tuple[ScheduledRun, ...]:
    """The active runs once ``made`` exists too (it is Pending until it starts)."""
    others = [r for r in active if r.name != made.name]
    return tuple(sorted([*others, made], key=lambda r: r.scheduled))
