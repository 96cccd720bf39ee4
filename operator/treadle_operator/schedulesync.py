"""WorkflowSchedule ↔ World schedule: put, status, mirrors, history, delete.

The operator runs no scheduler: ``reconcile`` (on every change of the object, and every
``TREADLE_OPERATOR_SCHEDULE_SYNC_SECONDS``) puts the object in its World as a schedule
(``treadle.schedules.api.store``: through the World contract only; a put that changes
nothing writes nothing), pinned to the latest ready revision of the WorkflowDeployment
its ``runTemplate`` names, whose workers fire it (the World's claim makes each firing one
run). Then it mirrors the runs the schedule fired as WorkflowRuns (``mirror_run``: also
called by ``mirrored.mirror`` as the World reports each creation, so a firing shows at
once), prunes the finished mirrors past the history limits, and writes status from the
World schedule. ``delete`` (kopf's finalizer) deletes the World schedule.

Mirrors are named ``<schedule>-<unix seconds>`` and adopted by ``runs.start`` through
their ``treadle.dev/mirrored-run`` annotation (``binding.refusal`` checks the run was
fired by this schedule for that time). ``status.lastMirroredTime`` is the newest firing
mirrored: an older run (a mirror pruned by the history limits) is not shown again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from datetime import datetime
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from treadle import errors as engine_errors
from treadle.schedules import api as schedules_api
from treadle.schedules import cron as cron_
from treadle.schedules import spec as schedule_spec
from treadle.sdk import functions
from treadle.world import contract, records
from treadle.world.records import RunRecord
from treadle_operator import models, runs, schedules
from treadle_operator.schedulemodels import WorkflowScheduleSpec, WorkflowScheduleStatus
from treadle_operator.schedules import LABEL, PLURAL, ScheduledRun
from treadle_operator.state import ScheduleOwner, State

log = logging.getLogger("treadle.operator.schedules")

LISTED_RUNS = 50  # the newest World runs of a schedule looked at per sync for mirrors
_REASONS = {"spec.schedule": "InvalidSchedule", "spec.timeZone": "UnknownTimeZone"}


def _key(body: dict[str, Any]) -> str:
    meta = body.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


class _Refused(Exception):
    """The spec cannot be put in the World: (reason, message naming the field)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _checked(
    name: str, spec: WorkflowScheduleSpec, revision: str, catalogue: Any
) -> tuple[records.ScheduleSpec, cron_.Cron]:
    """The World schedule's spec and cron; ``_Refused`` naming the CRD's field."""
    template = spec.run_template
    arguments = runs.arguments(template.input)
    if isinstance(arguments, str):
        raise _Refused("InvalidInput", f"spec.runTemplate.input: {arguments.split(': ', 1)[-1]}")
    args, kwargs = arguments
    known = set(catalogue) if isinstance(catalogue, dict) else None
    try:
        encoded = functions.encode_arguments(tuple(args), kwargs, "spec.runTemplate.input")
        return schedule_spec.check(
            name=name, workflow_name=template.workflow, known_workflows=known,
            cron=spec.schedule, timezone=spec.time_zone,
            overlap=schedules.OVERLAPS[spec.concurrency_policy],
            catchup_window=schedules.window_seconds(spec), input=encoded,
            paused=spec.suspend, deployment=revision, catchup="latest",
            cron_field="spec.schedule", timezone_field="spec.timeZone",
        )  # fmt: skip
    except engine_errors.ScheduleInvalid as exc:
        if exc.field == "workflow":
            message = str(exc).removeprefix("workflow: ")
            raise _Refused("UnknownWorkflow", f"spec.runTemplate.workflow: {message}") from None
        raise _Refused(_REASONS.get(exc.field, "InvalidSpec"), str(exc)) from None
    except (TypeError, ValueError) as exc:
        raise _Refused("InvalidInput", f"spec.runTemplate.input: {exc}") from None


def _same_input(held: records.ScheduleSpec, checked: records.ScheduleSpec) -> records.ScheduleSpec:
    """``checked`` with the stored input when both decode to the same arguments: under the
    deployment's payload keys each encoding differs (a fresh nonce), and a sync must not
    re-put an unchanged schedule."""
    if held.input == checked.input:
        return checked
    try:
        same = functions.decode_arguments(held.input) == functions.decode_arguments(checked.input)
    except Exception:  # an input stored under a key since rotated away: put the new one
        return checked
    return dataclasses.replace(checked, input=held.input) if same else checked


async def reconcile(state: State, body: dict[str, Any]) -> None:
    """Put the schedule in its World, mirror its runs, prune, write status."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    previous = models.parse_status(WorkflowScheduleStatus, body.get("status"))
    generation = meta.get("generation")
    world_name = schedules.world_name(namespace, name)
    try:
        problem = schedules.name_problem(name)
        if problem is not None:
            raise _Refused("InvalidName", problem)
        try:
            spec = WorkflowScheduleSpec.model_validate(body.get("spec") or {})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in ("spec", *first["loc"]))
            raise _Refused("InvalidSpec", f"{where}: {first['msg']}") from None
        try:
            world, wfd = await runs.world_of(state, namespace, spec.run_template.deployment)
        except runs.NotYet as exc:
            await _write(state, body, previous, schedules.waiting(
                previous, generation, exc.reason, str(exc)))  # fmt: skip
            return
        revision = (wfd.get("status") or {}).get("latestRevision")
        if not revision:
            message = f"WorkflowDeployment {spec.run_template.deployment} has no ready revision"
            await _write(state, body, previous, schedules.waiting(
                previous, generation, "NoReadyRevision", message))  # fmt: skip
            return
        served = await world.deployments.get(revision)
        checked, cron = _checked(world_name, spec, revision, served and served.catalogue)
    except _Refused as exc:
        await _invalid(state, body, previous, generation, exc.reason, str(exc))
        await _hold(state, body, world_name)
        return
    table = schedules_api.schedules_of(world)
    before = None
    with contextlib.suppress(engine_errors.ScheduleNotFound):
        before = await table.get(world_name)
    if before is not None:
        checked = _same_input(before.spec, checked)
    record = await schedules_api.store(table, checked, cron)
    if before is None or before.spec != record.spec:
        log.info("WorkflowSchedule %s put in the World as schedule %s (revision %s)",
                 _key(body), world_name, revision)  # fmt: skip
    state.schedules[world_name] = ScheduleOwner(body, revision)
    last = await _mirror_missing(state, world, body, previous)
    owned = await _owned(state, meta)
    for gone in schedules.prune(owned, spec.successful_runs_history_limit,
                                spec.failed_runs_history_limit):  # fmt: skip
        await state.kube.delete(runs.PLURAL, namespace, gone)
        log.info("WorkflowSchedule %s: pruned WorkflowRun %s (history limit)", _key(body), gone)
        owned = [r for r in owned if r.name != gone]
    status = schedules.status_of(previous, generation, record, owned, last_mirrored=last)
    await _report(state, body, previous, status)
    await _write(state, body, previous, status)


async def _hold(state: State, body: dict[str, Any], world_name: str) -> None:
    """A spec made invalid after it was put: pause its World schedule (best effort), so it
    fires nothing until the spec is fixed (the fixed spec resumes it, CronJob's catch-up)."""
    state.schedules.pop(world_name, None)
    deployment = ((body.get("spec") or {}).get("runTemplate") or {}).get("deployment")
    if not isinstance(deployment, str) or not deployment:
        return
    try:
        world, _ = await runs.world_of(state, body["metadata"]["namespace"], deployment)
        _, changed = await schedules_api.set_paused(
            schedules_api.schedules_of(world), world_name, True
        )
    except (runs.NotYet, engine_errors.ScheduleNotFound):
        return
    if changed:
        log.warning("WorkflowSchedule %s: its spec is invalid; World schedule %s paused",
                    _key(body), world_name)  # fmt: skip


async def _invalid(
    state: State,
    body: dict[str, Any],
    previous: WorkflowScheduleStatus,
    generation: int | None,
    reason: str,
    message: str,
) -> None:
    status = schedules.invalid(previous, generation, reason, message)
    said = next((c for c in previous.conditions if c.type == "ScheduleValid"), None)
    if said is None or said.message != message:
        log.warning("WorkflowSchedule %s: %s", _key(body), message)
        await state.kube.event(body, reason, message, warning=True)
    await _write(state, body, previous, status)


async def _report(
    state: State,
    body: dict[str, Any],
    previous: WorkflowScheduleStatus,
    now: WorkflowScheduleStatus,
) -> None:
    """Events for what the World counted since the last sync (missed, skipped)."""
    if now.missed_schedules > previous.missed_schedules:
        more = now.missed_schedules - previous.missed_schedules
        await state.kube.event(body, "Missed", f"{more} schedule time(s) passed over (workers "
                               "down, suspended, past startingDeadlineSeconds, or not the latest "
                               "due); only the latest fires", warning=True)  # fmt: skip
    if now.skipped_schedules > previous.skipped_schedules:
        more = now.skipped_schedules - previous.skipped_schedules
        await state.kube.event(body, "AlreadyActive", f"{more} firing(s) skipped: a run was "
                               "still active (concurrencyPolicy Forbid)")  # fmt: skip


async def _mirror_missing(
    state: State, world: contract.World, body: dict[str, Any], previous: WorkflowScheduleStatus
) -> datetime | None:
    """Mirror the schedule's newest runs not shown yet; the newest firing mirrored."""
    meta = body["metadata"]
    last = schedules.parse_stamp(previous.last_mirrored_time)
    world_name = schedules.world_name(meta["namespace"], meta["name"])
    page = await world.runs.list(
        attributes={schedules.SCHEDULE_ATTRIBUTE: world_name}, limit=LISTED_RUNS
    )
    for run in sorted(page.runs, key=lambda r: r.created_at):
        at = schedules.fired_at(run)
        if at is None or (last is not None and at.replace(microsecond=0) <= last):
            continue
        await mirror_run(state, body, run)
        last = at.replace(microsecond=0)
    return last


async def mirror_run(state: State, schedule: dict[str, Any], run: RunRecord) -> None:
    """Show ``run``, fired by ``schedule``, as its WorkflowRun (made once: a 409 is it)."""
    at = schedules.fired_at(run)
    if at is None:
        return
    body = schedules.mirror_body(schedule, run, at)
    meta = body["metadata"]
    try:
        await state.kube.create(runs.PLURAL, meta["namespace"], body)
    except ApiException as exc:
        if exc.status == 409:
            return
        if exc.status in (400, 403, 422):
            message = f"run {run.run_id} fired for {schedules.stamp(at)} not shown: {exc.reason}"
            await state.kube.event(schedule, "MirrorRefused", message, warning=True)
            return
        raise
    log.info("WorkflowSchedule %s fired run %s for %s: WorkflowRun %s", _key(schedule),
             run.run_id, schedules.stamp(at), meta["name"])  # fmt: skip
    await state.kube.event(
        schedule, "RunCreated", f"WorkflowRun {meta['name']} for {schedules.stamp(at)}"
    )


async def _owned(state: State, meta: dict[str, Any]) -> list[ScheduledRun]:
    listed = await state.kube.custom.list_namespaced_custom_object(
        models.GROUP, models.VERSION, meta["namespace"], runs.PLURAL,
        label_selector=f"{LABEL}={meta['name']}",
    )  # fmt: skip
    found = []
    for item in listed.get("items") or []:
        if not schedules.owned_by(item, meta["uid"]):
            continue
        if (item.get("metadata") or {}).get("deletionTimestamp"):
            continue  # pruned (or deleted by hand), finishing its finalizer
        run = schedules.scheduled_run(item)
        if run is not None:
            found.append(run)
    return found


async def _write(
    state: State,
    body: dict[str, Any],
    previous: WorkflowScheduleStatus,
    status: WorkflowScheduleStatus,
) -> None:
    if status == previous:
        return
    meta = body["metadata"]
    # Unset fields must be removed (a merge patch keeps what it does not name).
    dumped = models.dump(status)
    for field in ("nextScheduleTime", "lastRunId", "lastScheduleTime"):
        dumped.setdefault(field, None)
    await state.kube.patch_status(PLURAL, meta["namespace"], meta["name"], dumped)


async def delete(state: State, body: dict[str, Any]) -> None:
    """The object is being deleted: delete its World schedule (runs already fired go on;
    their mirrors go with the object, by their owner reference)."""
    meta = body["metadata"]
    world_name = schedules.world_name(meta["namespace"], meta["name"])
    state.schedules.pop(world_name, None)
    deployment = ((body.get("spec") or {}).get("runTemplate") or {}).get("deployment")
    if not deployment:
        return
    try:
        world, _ = await runs.world_of(state, meta["namespace"], str(deployment))
    except runs.NotYet as exc:
        if exc.reason == "WorldUnavailable":
            raise  # retried: the finalizer stays until the World schedule is gone
        log.warning("WorkflowSchedule %s deleted; its World schedule %s could not be reached "
                    "(%s) and stays", _key(body), world_name, exc)  # fmt: skip
        return
    if await schedules_api.schedules_of(world).delete(world_name):
        log.info("WorkflowSchedule %s deleted: World schedule %s deleted", _key(body), world_name)


def owner_of(state: State, run: RunRecord) -> ScheduleOwner | None:
    """The WorkflowSchedule (as last reconciled) that fired ``run``, if it is one of ours."""
    return state.schedules.get(str(run.attributes.get(schedules.SCHEDULE_ATTRIBUTE)))
