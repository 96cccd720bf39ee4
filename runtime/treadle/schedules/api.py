"""Schedules from the client: ``app.schedule(...)`` and ``app.get_schedule(name)``.

``Schedule`` is a handle on one schedule of the app's World: ``get``, ``pause``,
``resume``, ``trigger`` (a firing now), ``backfill`` (one firing per cron time in a
range), ``upcoming`` (the next firing times) and ``delete``. A firing made here is
claimed and started by this process (``firing.fire_now``), on the World's latest
deployment (the starter's own when the World knows none); the cron's own firings are
the workers' (``loop``). Every refusal of bad input is a ``ScheduleInvalid`` raised
before anything is recorded.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue

from treadle import clock, errors
from treadle.schedules import cron as cron_
from treadle.schedules import firing
from treadle.schedules import spec as spec_
from treadle.world import contract, records

if TYPE_CHECKING:
    from treadle.client import Run, Workflows

log = logging.getLogger("treadle.schedules")


def schedules_of(world: contract.World) -> contract.Schedules:
    """The World's schedules table; ``WorldContractError`` for a World without one."""
    table = getattr(world, "schedules", None)
    if not isinstance(table, contract.Schedules):
        raise errors.WorldContractError(
            f"{type(world).__name__} has no schedules (world.schedules); schedules need the "
            "local, Postgres or memory World"
        )
    return table


def starter(app: Workflows, world: contract.World, *, deployment_id: str | None) -> firing.Starter:
    """Starts a firing's run with ``treadle.client.start_run`` (safe to repeat: the id is
    the firing's) on the schedule's deployment; when it names none, ``deployment_id``
    (None: the World's latest)."""
    from treadle import client

    async def start(spec: records.ScheduleSpec, run_id: str, fire_at: datetime) -> None:
        deployment = spec.deployment_id or deployment_id
        if deployment is None:
            deployment = await world.deployments.latest() or app.settings.TREADLE_DEPLOYMENT_ID
        try:
            await client.start_run(
                world,
                name=spec.workflow_name,
                data=spec.input,
                deployment_id=deployment,
                spec_version=client.minted_spec_version(app.settings, world),
                run_id=run_id,
                attributes=firing.attributes_for(spec.name, fire_at),
                limits_=app.limits,
            )
        except errors.WorldContractError:
            # The run exists with another input (the schedule's input changed between a
            # claim and this retried start): the firing happened; nothing more to do.
            log.info("run %s: fired already by schedule %s", run_id, spec.name)

    return start


def _input(args: Sequence[Any], kwargs: Mapping[str, Any] | None, input: JsonValue, app: Workflows,
           name: str) -> JsonValue:  # fmt: skip
    from treadle.sdk import functions

    if input is not None:
        if args or kwargs:
            raise errors.ScheduleInvalid("input", "input: give args/kwargs or input, not both")
        if not isinstance(input, dict) or set(input) != {"args", "kwargs"}:
            raise errors.ScheduleInvalid(
                "input", 'input: the encoded arguments, {"args": [...], "kwargs": {...}}'
            )
        return input
    app.use_payload_keys()
    return functions.encode_arguments(
        tuple(args), dict(kwargs or {}), f"schedule {name}", limits_=app.limits
    )


async def _known_workflows(app: Workflows, world: contract.World) -> set[str] | None:
    """The workflows a schedule may name: the app's, else the latest deployment's
    catalogue; None when neither is known (a bare client on a World with no worker yet)."""
    if app.workflows:
        return set(app.workflows)
    latest = await world.deployments.latest()
    record = None if latest is None else await world.deployments.get(latest)
    if record is None or not isinstance(record.catalogue, dict):
        return None
    return set(record.catalogue)


async def put(
    app: Workflows,
    name: str,
    workflow: Any,
    *,
    cron: str,
    timezone: str | None,
    overlap: str,
    catchup_window: float | timedelta,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None,
    input: JsonValue,
    paused: bool,
    deployment: str | None = None,
    catchup: str = "all",
) -> Schedule:
    """``app.schedule``: check everything, then create or update the schedule."""
    spec_.check_name(name)
    workflow_name = workflow if isinstance(workflow, str) else getattr(workflow, "name", None)
    if not isinstance(workflow_name, str):
        raise errors.ScheduleInvalid("workflow", f"workflow: {workflow!r} is not a workflow")
    world = await app.world()
    table = schedules_of(world)
    checked, c = spec_.check(
        name=name, workflow_name=workflow_name,
        known_workflows=await _known_workflows(app, world), cron=cron, timezone=timezone,
        overlap=overlap, catchup_window=catchup_window,
        input=_input(args, kwargs, input, app, name), paused=paused, limits_=app.limits,
        deployment=deployment, catchup=catchup,
    )  # fmt: skip
    await store(table, checked, c)
    app.schedules_changed()
    return Schedule(app, name)


async def store(
    table: contract.Schedules, checked: records.ScheduleSpec, c: cron_.Cron
) -> records.ScheduleRecord:
    """Create or update a checked schedule (``spec.check``): from the World contract alone,
    as the operator's WorkflowSchedule does. The same timing (cron, zone) keeps the stored
    ``next_fire_at`` (a due firing is not lost) unless the put resumes a paused schedule
    (then ``resumed_at``); a put that changes nothing
    writes nothing (the version stays: a reconcile loop does not churn the table)."""
    for _ in range(20):
        try:
            held = await table.get(checked.name)
        except errors.ScheduleNotFound:
            held = None
        if held is not None and held.spec == checked:
            return held
        next_fire_at = c.next_after(clock.utcnow())
        timing = (checked.cron, checked.timezone)
        if held is not None and (held.spec.cron, held.spec.timezone) == timing:
            if not held.state.paused or checked.paused:
                next_fire_at = held.state.next_fire_at  # same timing: a due firing is not lost
            else:
                next_fire_at = resumed_at(checked, held.state, c)
        # A compare-and-set on the version read: a claim made meanwhile (a worker moved
        # next_fire_at) is not written back over; read again and recompute.
        expected = 0 if held is None else held.version
        won = await table.put_if(checked, next_fire_at=next_fire_at, expected_version=expected)
        if won is not None:
            return won
    raise errors.StorageUnavailable(f"schedule {checked.name}: lost 20 puts in a row")


def resumed_at(
    spec: records.ScheduleSpec, state: records.ScheduleState, c: cron_.Cron
) -> datetime | None:
    """Where a resumed schedule fires from. ``catchup="all"`` (Temporal's rule): the next
    cron time after now, firings while paused are not caught up. ``"latest"`` (CronJob's
    rule for ``suspend``): the first time passed over while paused, so that the loop fires
    the latest of them (if within the catch-up window) and counts the rest as missed."""
    if spec.catchup == "latest" and state.next_fire_at is not None:
        return state.next_fire_at
    return c.next_after(clock.utcnow())


async def set_paused(
    table: contract.Schedules, name: str, paused: bool
) -> tuple[records.ScheduleRecord, bool]:
    """Pause or resume ``name`` (idempotent); the record, and whether it changed. Where a
    resume fires from: ``resumed_at``."""
    for _ in range(20):
        record = await table.get(name)
        state = record.state
        if state.paused == paused:
            return record, False
        next_fire_at = state.next_fire_at
        if not paused:
            next_fire_at = resumed_at(record.spec, state, spec_.parsed(record.spec))
        new = dataclasses.replace(state, paused=paused, next_fire_at=next_fire_at)
        won = await table.update(name, expected_version=record.version, state=new)
        if won is not None:
            log.info("schedule %s: %s", name, "paused" if paused else "resumed")
            return won, True
    raise errors.StorageUnavailable(f"schedule {name}: lost 20 updates in a row")


class Schedule:
    """A handle on the schedule ``name`` of an app's World."""

    def __init__(self, app: Workflows, name: str) -> None:
        self.app = app
        self.name = spec_.check_name(name)

    def __repr__(self) -> str:
        return f"<Schedule {self.name}>"

    def run_at(self, fire_at: datetime) -> Run:
        """The run the schedule's firing at ``fire_at`` is (or would be): its keyed id."""
        return self.app.get_run(firing.run_id_for(self.name, fire_at))

    async def _table(self) -> tuple[contract.World, contract.Schedules]:
        world = await self.app.world()
        return world, schedules_of(world)

    async def get(self) -> records.ScheduleRecord:
        """The stored schedule; ``ScheduleNotFound`` when there is none."""
        return await (await self._table())[1].get(self.name)

    async def _set_paused(self, paused: bool) -> records.ScheduleRecord:
        _world, table = await self._table()
        record, changed = await set_paused(table, self.name, paused)
        if changed:
            self.app.schedules_changed()
        return record

    async def pause(self) -> records.ScheduleRecord:
        """Stop firing (a trigger or backfill still fires); idempotent."""
        return await self._set_paused(True)

    async def resume(self) -> records.ScheduleRecord:
        """Fire again from the next cron time after now; idempotent."""
        return await self._set_paused(False)

    async def trigger(self, *, overlap: str | None = None) -> Run | None:
        """A firing now (its time: now, to the millisecond), under the schedule's overlap
        policy or ``overlap``; the run it started, or None when the policy skipped or
        buffered it."""
        chosen = None if overlap is None else spec_.check_overlap(overlap)
        world, table = await self._table()
        await table.get(self.name)
        now = clock.utcnow()
        at = now.replace(microsecond=now.microsecond // 1000 * 1000)
        start = starter(self.app, world, deployment_id=None)
        decision = await firing.fire_now(world, table, start, self.name, at, overlap=chosen)
        self.app.schedules_changed()
        if decision in ("start", "cancel_and_start"):
            return self.app.get_run(firing.run_id_for(self.name, at))
        return None

    async def backfill(
        self, start: datetime | str, end: datetime | str, *, overlap: str | None = None
    ) -> list[tuple[datetime, str]]:
        """One firing per cron time in ``[start, end]``, in order, each under the overlap
        policy (or ``overlap``: ``allow`` starts them all). Returns (time, decision) of
        each; a retried backfill starts nothing twice. At most 1000 times per call."""
        begin = spec_.check_time(start, "start")
        finish = spec_.check_time(end, "end")
        if finish < begin:
            raise errors.ScheduleInvalid(
                "end", f"end: {finish.isoformat()} is before start {begin.isoformat()}"
            )
        chosen = None if overlap is None else spec_.check_overlap(overlap)
        world, table = await self._table()
        record = await table.get(self.name)
        times = list(
            spec_.firing_times(spec_.parsed(record.spec), begin - timedelta(microseconds=1),
                               finish, spec_.MAX_LISTED + 1)
        )  # fmt: skip
        if len(times) > spec_.MAX_LISTED:
            raise errors.ScheduleInvalid(
                "end", f"end: the range holds more than {spec_.MAX_LISTED} firings; split it"
            )
        fire = starter(self.app, world, deployment_id=None)
        done: list[tuple[datetime, str]] = []
        for t in times:
            done.append(
                (t, await firing.fire_now(world, table, fire, self.name, t, overlap=chosen))
            )
        self.app.schedules_changed()
        return done

    async def upcoming(
        self, count: int = 5, *, after: datetime | str | None = None
    ) -> list[datetime]:
        """The next ``count`` cron times after ``after`` (now), paused or not."""
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1000:
            raise errors.ScheduleInvalid("count", f"count: {count!r} is not a number 1-1000")
        since = clock.utcnow() if after is None else spec_.check_time(after, "after")
        record = await self.get()
        return list(spec_.firing_times(spec_.parsed(record.spec), since, None, count))

    async def delete(self) -> bool:
        """Remove the schedule (its runs stay); False when there was none."""
        gone = await (await self._table())[1].delete(self.name)
        self.app.schedules_changed()
        return gone


async def list_schedules(app: Workflows, *, limit: int = 1000) -> list[records.ScheduleRecord]:
    return await schedules_of(await app.world()).list(limit=limit)
