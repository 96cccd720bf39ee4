"""WorkflowSchedule as a World schedule: the mapping, the mirrors' names and bodies, the
history to prune and the status. Pure (no I/O): ``schedulesync`` reads and writes.

The operator runs no scheduler of its own: a WorkflowSchedule is put in the World as a
schedule (``treadle.schedules``, docs/schedules.md), fired by the workers of the
revision it is pinned to, exactly once per time (the World's claim). The CRD maps:

- ``schedule``/``timeZone`` as they are (one cron parser: ``treadle.schedules.cron``);
- ``concurrencyPolicy`` Allow → ``allow``, Forbid → ``skip``, Replace → ``cancel_other``;
- ``suspend`` → the World schedule paused; resuming fires the latest time passed over
  (``catchup="latest"``, CronJob's rule) if it is within the window;
- ``startingDeadlineSeconds`` → the catch-up window (unset: ``DEFAULT_WINDOW``), with
  ``catchup="latest"``: after a gap only the newest due time fires, as CronJob;
- ``runTemplate`` → the workflow and its input, on the named WorkflowDeployment's
  latest ready revision (the schedule's ``deployment_id``, moved on a rollout).

The World schedule is named ``<namespace>.<name>`` (a namespace holds no '.': the
split is unambiguous). Each run it fires carries that name as its ``treadle.schedule``
attribute; the operator mirrors it as the WorkflowRun ``<name>-<unix seconds of the
firing time>`` (as CronJob names Jobs), labelled ``treadle.dev/schedule: <name>`` and
owned by the schedule.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from treadle.world import records
from treadle.world.records import RunRecord
from treadle_operator import attrlabels, models
from treadle_operator.conditions import condition, merge_conditions
from treadle_operator.schedulemodels import (
    ScheduledRunRef,
    WorkflowScheduleSpec,
    WorkflowScheduleStatus,
)

PLURAL = "workflowschedules"
KIND = "WorkflowSchedule"
LABEL = "treadle.dev/schedule"
SCHEDULED_TIME = "treadle.dev/scheduled-time"
MIRRORED = "treadle.dev/mirrored-run"  # = runs.MIRRORED (runs imports this module's users)
SCHEDULE_ATTRIBUTE = "treadle.schedule"
SCHEDULED_AT_ATTRIBUTE = "treadle.scheduled_at"
MAX_NAME = 52  # as CronJob: the name, "-" and ten digits of unix time fit a label value
DEFAULT_WINDOW = timedelta(days=365)  # no startingDeadlineSeconds: the World's default
OVERLAPS: dict[str, records.ScheduleOverlap] = {
    "Allow": "allow",
    "Forbid": "skip",
    "Replace": "cancel_other",
}
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


def world_name(namespace: str, name: str) -> str:
    """The World schedule of the WorkflowSchedule ``namespace/name``."""
    return f"{namespace}.{name}"


def of_world_name(text: object) -> tuple[str, str] | None:
    """(namespace, name) of a World schedule the operator put, else None."""
    if not isinstance(text, str) or "." not in text:
        return None
    namespace, name = text.split(".", 1)
    return (namespace, name) if namespace and name else None


def window_seconds(spec: WorkflowScheduleSpec) -> float:
    """The catch-up window: ``startingDeadlineSeconds`` (0 reads as 1 s: the World needs a
    positive window, and a firing is a few milliseconds late at best), else a year."""
    if spec.starting_deadline_seconds is None:
        return DEFAULT_WINDOW.total_seconds()
    return float(max(spec.starting_deadline_seconds, 1))


def name_problem(name: str) -> str | None:
    if len(name) > MAX_NAME:
        return (
            f"metadata.name: {name!r} is {len(name)} characters; a WorkflowSchedule's name "
            f"is at most {MAX_NAME} (its runs are <name>-<unix time>, and it is a label value)"
        )
    return None


def run_name(schedule: str, at: datetime) -> str:
    """The WorkflowRun of a firing: ``<schedule>-<unix seconds>``, as CronJob names Jobs."""
    return f"{schedule}-{int(at.timestamp())}"


def fired_at(run: RunRecord) -> datetime | None:
    """The firing time a run of a schedule was started for (its attribute), else None."""
    text = run.attributes.get(SCHEDULED_AT_ATTRIBUTE)
    if not isinstance(text, str):
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return None
    return at if at.tzinfo is not None else None


def mirror_of(run: RunRecord) -> tuple[str, str] | None:
    """(namespace, WorkflowRun name) a run fired by a WorkflowSchedule is mirrored as."""
    owner = of_world_name(run.attributes.get(SCHEDULE_ATTRIBUTE))
    at = fired_at(run)
    if owner is None or at is None:
        return None
    return owner[0], run_name(owner[1], at)


def mirror_body(schedule: dict[str, Any], run: RunRecord, at: datetime) -> dict[str, Any]:
    """The WorkflowRun showing ``run``, fired by ``schedule`` for ``at``: the run template's
    spec, annotated with the run id (adopted by ``runs.start``), owned by the schedule."""
    meta = schedule["metadata"]
    template = dict((schedule.get("spec") or {}).get("runTemplate") or {})
    spec: dict[str, Any] = {
        "deployment": template.get("deployment"),
        "workflow": run.workflow_name,
    }
    for key in ("input", "ttlSecondsAfterFinished", "onDelete", "recordOutput"):
        if template.get(key) is not None:
            spec[key] = template[key]
    labels = attrlabels.labels(run.attributes)
    labels[LABEL] = meta["name"]
    return {
        "apiVersion": models.API_VERSION,
        "kind": "WorkflowRun",
        "metadata": {
            "name": run_name(meta["name"], at),
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": {MIRRORED: run.run_id, SCHEDULED_TIME: stamp(at)},
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
        "spec": spec,
    }


@dataclass(frozen=True)
class ScheduledRun:
    """A WorkflowRun mirroring one of this schedule's runs, as listed."""

    name: str
    uid: str
    scheduled: datetime
    phase: str
    completed_at: datetime | None = None

    @property
    def finished(self) -> bool:
        return self.phase in models.FINISHED_PHASES


def scheduled_run(body: dict[str, Any]) -> ScheduledRun | None:
    """A listed WorkflowRun as a ``ScheduledRun`` (``None``: it carries no schedule time)."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    at = parse_stamp((meta.get("annotations") or {}).get(SCHEDULED_TIME))
    if at is None:
        return None
    return ScheduledRun(
        name=str(meta.get("name")),
        uid=str(meta.get("uid")),
        scheduled=at,
        phase=str(status.get("phase") or "Pending"),
        completed_at=parse_stamp(status.get("completedAt")),
    )


def owned_by(body: dict[str, Any], uid: str) -> bool:
    """The object names the schedule of ``uid`` as its controller."""
    refs = (body.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid and r.get("kind") == KIND for r in refs)


def prune(runs: Iterable[ScheduledRun], successful: int, failed: int) -> tuple[str, ...]:
    """Finished runs past the limits, oldest first (Completed; Failed or Cancelled)."""
    newest = sorted((r for r in runs if r.finished), key=lambda r: r.scheduled, reverse=True)
    good = [r for r in newest if r.phase == "Completed"]
    bad = [r for r in newest if r.phase != "Completed"]
    gone = good[successful:] + bad[failed:]
    return tuple(r.name for r in sorted(gone, key=lambda r: r.scheduled))


def invalid(
    previous: WorkflowScheduleStatus, generation: int | None, reason: str, message: str
) -> WorkflowScheduleStatus:
    """The status of a spec that cannot be used: nothing fires."""
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


def waiting(
    previous: WorkflowScheduleStatus, generation: int | None, reason: str, message: str
) -> WorkflowScheduleStatus:
    """The spec is fine but cannot be put in the World yet (its deployment, its World)."""
    wanted = [
        condition("Ready", False, reason, message),
        condition("ScheduleValid", True, "Valid", ""),
        condition("Stalled", False, reason, message),
    ]
    return previous.model_copy(
        update={
            "observed_generation": generation,
            "conditions": _observed(merge_conditions(previous.conditions, wanted), generation),
        }
    )


def status_of(
    previous: WorkflowScheduleStatus,
    generation: int | None,
    record: records.ScheduleRecord,
    runs: Iterable[ScheduledRun],
    *,
    last_mirrored: datetime | None,
) -> WorkflowScheduleStatus:
    """The status from the World schedule ``record`` and the mirrors ``runs``."""
    state = record.state
    listed = list(runs)
    active = sorted((r for r in listed if not r.finished), key=lambda r: r.scheduled)
    completed = [r.completed_at or r.scheduled for r in listed if r.phase == "Completed"]
    success = max(
        (t for t in (parse_stamp(previous.last_successful_time), *completed) if t), default=None
    )
    nxt = None if state.paused else state.next_fire_at
    if state.paused:
        ready = condition("Ready", True, "Suspended", "spec.suspend is true: nothing fires")
    else:
        said = f"next at {stamp(nxt)}" if nxt else "it never fires again"
        ready = condition("Ready", True, "Scheduled", f"{said} (World schedule {record.name})")
    wanted = [
        ready,
        condition("ScheduleValid", True, "Valid", ""),
        condition("Stalled", False, "Valid", ""),
    ]
    return previous.model_copy(
        update={
            "observed_generation": generation,
            "world_schedule": record.name,
            "revision": record.spec.deployment_id,
            "last_schedule_time": stamp(state.last_fired_at) if state.last_fired_at else None,
            "last_successful_time": stamp(success) if success else None,
            "next_schedule_time": stamp(nxt) if nxt else None,
            "last_run_id": state.last_run_id,
            "active": [
                ScheduledRunRef(name=r.name, uid=r.uid, scheduled_time=stamp(r.scheduled))
                for r in active
            ],
            "active_count": len(active),
            "missed_schedules": state.missed,
            "skipped_schedules": state.skipped,
            "last_mirrored_time": stamp(last_mirrored) if last_mirrored else None,
            "conditions": _observed(merge_conditions(previous.conditions, wanted), generation),
        }
    )


def _observed(conditions: list[models.Condition], generation: int | None) -> list[Any]:
    return [c.model_copy(update={"observed_generation": generation}) for c in conditions]
