"""WorkflowSchedule timers: one asyncio task per schedule, asleep until its next firing.

``handlers`` feeds ``Scheduler.seen`` every watch event of a WorkflowSchedule (kopf
lists them all at start, so a restarted operator picks every schedule up again) and
``Scheduler.run_changed`` every event of a WorkflowRun labelled
``treadle.dev/schedule``. Each schedule's task reconciles once, then sleeps until the
next firing time (``status.nextScheduleTime``) or until the schedule, or the phase of
one of its runs, changes; never a busy loop. A sleep is capped at ``WAKE_CAP_SECONDS``
so a step of the wall clock (NTP) delays a firing by at most that much.

One reconcile: read the WorkflowRuns the schedule owns, ``schedules.plan``, cancel
(Replace), create the firing's WorkflowRun, prune history, then write status. The
run is created *before* status records it: an operator killed in between fires the
same time again on restart, which finds the run by its name (409) and adopts it.
A reconcile that fails (API errors) is retried with a backoff, logged, never raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from treadle_operator import binding, cron, models, schedules
from treadle_operator.errors import InvalidSchedule
from treadle_operator.kube import MERGE_PATCH
from treadle_operator.schedulemodels import WorkflowScheduleSpec, WorkflowScheduleStatus
from treadle_operator.schedules import LABEL, PLURAL, ScheduledRun
from treadle_operator.state import State

log = logging.getLogger("treadle.operator.schedules")

RUNS = "workflowruns"
WAKE_CAP_SECONDS = 300.0
BACKOFF_MAX_SECONDS = 30.0
REPORTED_KEPT = 64  # (reason, time) pairs remembered so an Event is posted once
_MERGE: dict[str, Any] = {"_content_type": MERGE_PATCH}  # merge patches, not JSON patches


@dataclass
class _Timer:
    body: dict[str, Any]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    phases: dict[str, str] = field(default_factory=dict)  # run name -> phase last seen
    reported: dict[tuple[str, str], None] = field(default_factory=dict)  # Events posted (last)
    refused: str | None = None  # why the latest firing's WorkflowRun was refused, until one is not
    next_time: datetime | None = None  # the next firing, as last planned


def _key(body: dict[str, Any]) -> str:
    meta = body.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _version(body: dict[str, Any]) -> int | None:
    text = (body.get("metadata") or {}).get("resourceVersion")
    return int(text) if isinstance(text, str) and text.isdigit() else None


def _api_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


class Scheduler:
    """Every WorkflowSchedule the operator serves, each with its timer task."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.timers: dict[str, _Timer] = {}

    # -- events -----------------------------------------------------------------------------

    def seen(self, event_type: str | None, body: dict[str, Any]) -> None:
        key = _key(body)
        timer = self.timers.get(key)
        uid = (body.get("metadata") or {}).get("uid")
        if event_type == "DELETED" or (body.get("metadata") or {}).get("deletionTimestamp"):
            self._stop(key)
            return
        if timer is not None and (timer.body.get("metadata") or {}).get("uid") != uid:
            self._stop(key)  # deleted and made again under the same name
            timer = None
        if timer is None:
            timer = _Timer(body=body)
            self.timers[key] = timer
            timer.task = asyncio.create_task(self._loop(key, timer), name=f"schedule {key}")
            return
        held, new = _version(timer.body), _version(body)
        if held is None or new is None or new >= held:
            timer.body = body
        timer.wake.set()

    def run_changed(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A run of a schedule appeared, changed phase or went: its schedule looks again."""
        meta = body.get("metadata") or {}
        owner = (meta.get("labels") or {}).get(LABEL)
        timer = self.timers.get(f"{meta.get('namespace')}/{owner}")
        if timer is None:
            return
        name = str(meta.get("name"))
        if event_type == "DELETED":
            if timer.phases.pop(name, None) is not None:
                timer.wake.set()
            return
        phase = str((body.get("status") or {}).get("phase") or "Pending")
        if timer.phases.get(name) != phase:
            timer.phases[name] = phase
            timer.wake.set()

    def _stop(self, key: str) -> None:
        timer = self.timers.pop(key, None)
        if timer is not None and timer.task is not None:
            timer.task.cancel()

    async def close(self) -> None:
        tasks = [t.task for t in self.timers.values() if t.task is not None]
        self.timers.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- the timer --------------------------------------------------------------------------

    async def _loop(self, key: str, timer: _Timer) -> None:
        backoff = 1.0
        while self.timers.get(key) is timer:
            timer.wake.clear()
            try:
                delay = await self.reconcile(timer)
                backoff = 1.0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                said = (
                    f"HTTP {exc.status} {exc.reason}: {_api_message(exc)}"
                    if isinstance(exc, ApiException)
                    else f"{type(exc).__name__}: {exc}"
                )
                log.warning("WorkflowSchedule %s: reconcile failed, retried in %.0f s: %s",
                            key, backoff, said)  # fmt: skip
                # A failing look never delays a firing: retry by then at the latest.
                due = schedules.wake_in(timer.next_time, datetime.now(UTC), backoff)
                delay = due if due else backoff  # a firing due already: back off
                backoff = min(backoff * 2, BACKOFF_MAX_SECONDS)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(timer.wake.wait(), delay)

    async def reconcile(self, timer: _Timer) -> float | None:
        """One look at the schedule; returns how long to sleep (``None``: until a change)."""
        body = timer.body
        meta = body["metadata"]
        previous = models.parse_status(WorkflowScheduleStatus, body.get("status"))
        generation = meta.get("generation")
        problem = schedules.name_problem(meta["name"])
        spec: WorkflowScheduleSpec | None = None
        parsed: cron.Cron | None = None
        if problem is None:
            try:
                spec = WorkflowScheduleSpec.model_validate(body.get("spec") or {})
                parsed = cron.parse(spec.schedule, spec.time_zone)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in ("spec", *first["loc"]))
                problem = f"{where}: {first['msg']}"
            except InvalidSchedule as exc:
                reason = "UnknownTimeZone" if exc.field == "spec.timeZone" else "InvalidSchedule"
                await self._invalid(timer, previous, generation, reason, str(exc))
                return None
        if problem is not None or spec is None or parsed is None:
            reason = "InvalidName" if problem and problem.startswith("metadata") else "InvalidSpec"
            await self._invalid(timer, previous, generation, reason, str(problem))
            return None

        runs = await self._runs(meta)
        timer.phases = {r.name: r.phase for r in runs}
        last = schedules.parse_stamp(previous.last_schedule_time)
        created = schedules.parse_stamp(meta.get("creationTimestamp")) or datetime.now(UTC)
        now = datetime.now(UTC)
        plan = schedules.plan(spec, parsed, last_schedule=last, created=created, runs=runs, now=now)
        timer.next_time = plan.next_time
        for name in plan.replace:
            await self._cancel(body, name)
        if plan.fire is not None:
            made, timer.refused = await self._fire(timer, plan)
            last = plan.fire
            if made is not None:
                plan = replace(plan, active=schedules.after_firing(plan.active, made))
                timer.phases[made.name] = made.phase
        elif plan.skipped is not None and plan.skipped_time is not None:
            await self._skipped(timer, spec, plan)
        for name in plan.prune:
            await self.state.kube.delete(RUNS, meta["namespace"], name)
            log.info("WorkflowSchedule %s: pruned WorkflowRun %s (history limit)", _key(body), name)
        status = schedules.status_of(
            previous, generation, plan=plan, last_schedule=last, refused=timer.refused
        )
        await self._write(timer, previous, status)
        return schedules.wake_in(plan.next_time, datetime.now(UTC), WAKE_CAP_SECONDS)

    # -- steps ------------------------------------------------------------------------------

    async def _runs(self, meta: dict[str, Any]) -> list[ScheduledRun]:
        listed = await self.state.kube.custom.list_namespaced_custom_object(
            models.GROUP, models.VERSION, meta["namespace"], RUNS,
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

    async def _fire(
        self, timer: _Timer, plan: schedules.Plan
    ) -> tuple[ScheduledRun | None, str | None]:
        """Create the firing's WorkflowRun (or find it made already); why it was refused."""
        body = timer.body
        meta = body["metadata"]
        assert plan.fire is not None
        wanted = schedules.run_body(body, plan.fire)
        name = wanted["metadata"]["name"]
        run_id = binding.run_id(meta["namespace"], name, wanted["spec"]["runKey"])
        at = schedules.stamp(plan.fire)
        try:
            made = await self.state.kube.create(RUNS, meta["namespace"], wanted)
        except ApiException as exc:
            if exc.status == 409:
                existing = await self.state.kube.get(RUNS, meta["namespace"], name)
                if existing is not None and schedules.owned_by(existing, meta["uid"]):
                    log.info("WorkflowSchedule %s: the firing at %s is WorkflowRun %s (run %s), "
                             "made already: adopted", _key(body), at, name, run_id)  # fmt: skip
                    return schedules.scheduled_run(existing), None
                message = f"firing at {at} not run: a WorkflowRun {name} exists that this "
                message += "schedule did not make"
            elif exc.status in (400, 403, 422):
                message = f"firing at {at}: WorkflowRun {name} refused: {_api_message(exc)}"
            else:
                raise
            await self._event_once(timer, "RunRefused", at, message, warning=True)
            return None, message
        log.info("WorkflowSchedule %s fired WorkflowRun %s (run %s) for %s",
                 _key(body), name, run_id, at)  # fmt: skip
        if plan.missed:
            more = "more than 100" if plan.missed > schedules.MANY_MISSED else str(plan.missed)
            reason = "TooManyMissedTimes" if plan.missed > schedules.MANY_MISSED else "Missed"
            await self._event_once(timer, reason, at, f"{more} schedule times passed over before "
                                   f"{at}; only the latest fires", warning=True)  # fmt: skip
        await self.state.kube.event(body, "RunCreated", f"WorkflowRun {name} for {at}")
        return schedules.scheduled_run(made) or ScheduledRun(name, "", plan.fire, "Pending"), None

    async def _skipped(
        self, timer: _Timer, spec: WorkflowScheduleSpec, plan: schedules.Plan
    ) -> None:
        assert plan.skipped_time is not None
        at = schedules.stamp(plan.skipped_time)
        if plan.skipped == "Forbid":
            names = ", ".join(r.name for r in plan.active)
            await self._event_once(timer, "AlreadyActive", at, f"firing at {at} skipped: "
                                   f"{names} still active (concurrencyPolicy Forbid)")  # fmt: skip
        elif plan.skipped == "DeadlineExceeded":
            await self._event_once(timer, "MissSchedule", at, f"firing at {at} skipped: more than "
                                   f"startingDeadlineSeconds ({spec.starting_deadline_seconds}) "
                                   "late", warning=True)  # fmt: skip

    async def _cancel(self, body: dict[str, Any], name: str) -> None:
        """Replace: cancel an active run through its own ``spec.cancel``."""
        try:
            await self.state.kube.custom.patch_namespaced_custom_object(
                models.GROUP, models.VERSION, body["metadata"]["namespace"], RUNS, name,
                {"spec": {"cancel": True}}, **_MERGE,
            )  # fmt: skip
        except ApiException as exc:
            if exc.status != 404:
                raise
            return
        log.info("WorkflowSchedule %s: cancelling WorkflowRun %s (Replace)", _key(body), name)
        await self.state.kube.event(body, "Replaced", f"WorkflowRun {name} cancelled (Replace)")

    async def _invalid(
        self,
        timer: _Timer,
        previous: WorkflowScheduleStatus,
        generation: int | None,
        reason: str,
        message: str,
    ) -> None:
        timer.next_time = None
        status = schedules.status_of(
            previous, generation, plan=None, last_schedule=None, problem=(reason, message)
        )
        await self._event_once(timer, reason, str(generation), message, warning=True)
        await self._write(timer, previous, status)

    async def _event_once(
        self, timer: _Timer, reason: str, at: str, message: str, *, warning: bool = False
    ) -> None:
        if (reason, at) in timer.reported:
            return
        if warning:
            log.warning("WorkflowSchedule %s: %s", _key(timer.body), message)
        timer.reported[(reason, at)] = None
        while len(timer.reported) > REPORTED_KEPT:
            del timer.reported[next(iter(timer.reported))]
        await self.state.kube.event(timer.body, reason, message, warning=warning)

    async def _write(
        self, timer: _Timer, previous: WorkflowScheduleStatus, status: WorkflowScheduleStatus
    ) -> None:
        if status == previous:
            return
        meta = timer.body["metadata"]
        try:
            written = await self.state.kube.custom.patch_namespaced_custom_object_status(
                models.GROUP, models.VERSION, meta["namespace"], PLURAL, meta["name"],
                {"status": models.dump(status)}, **_MERGE,
            )  # fmt: skip
        except ApiException as exc:
            if exc.status == 404:
                return  # deleted meanwhile
            raise
        if isinstance(written, dict) and (_version(written) or 0) >= (_version(timer.body) or 0):
            timer.body = written
