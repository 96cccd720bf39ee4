"""The firing loop: every worker runs one (``Worker.start``), none is a leader.

A pass lists the World's schedules, and for each one whose workflow this worker
serves handles what is due (``tick``): a buffered firing whose blocking run ended, the
cron firings up to now (those older than the catch-up window skipped and counted as
``missed``, the rest each decided by the overlap policy and claimed, ``firing``). Then
it sleeps until the soonest next firing, woken early by ``wake()`` (a schedule changed
in this process, a buffered firing's blocking run ended), and at least every
``TREADLE_SCHEDULES_RESCAN_SECONDS`` (changes made by another process). Never a busy
loop: a pass that finds nothing due sleeps.

Two loops (two workers, two pods) handle the same firing at most once between them:
each firing is claimed by a compare-and-set on the schedule's version first.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from datetime import datetime, timedelta

from treadle import clock, errors, limits, resultwait
from treadle.orchestrator.runtime import Runtime
from treadle.schedules import cron as cron_
from treadle.schedules import firing
from treadle.schedules import spec as spec_
from treadle.world import contract, records

log = logging.getLogger("treadle.schedules.loop")

MAX_ACTIONS_PER_TICK = 1000  # then the pass moves on and the next one goes on at once
MAX_MISSED_COUNTED = 100_000  # beyond it, one jump to the window (missed: a lower bound)
ERROR_RETRY_SECONDS = 5.0
STOP_TRIES = 10  # cancellations sent to a task that goes on, STOP_WAIT_SECONDS apart
STOP_WAIT_SECONDS = 0.5
ONE = timedelta(microseconds=1)


@dataclasses.dataclass(frozen=True, slots=True)
class Look:
    """When a schedule next needs a look, and a run whose end should wake the loop."""

    at: datetime | None
    watch_run_id: str | None = None


def skip_missed(c: cron_.Cron, t: datetime | None, cutoff: datetime) -> tuple[int, datetime | None]:
    """How many firings from ``t`` are before ``cutoff``, and the first one that is not."""
    count = 0
    while t is not None and t < cutoff:
        count += 1
        if count >= MAX_MISSED_COUNTED:
            return count, c.next_after(cutoff - ONE)
        t = c.next_after(t)
    return count, t


def _latest_due(
    c: cron_.Cron, state: records.ScheduleState, now: datetime
) -> tuple[int, datetime] | None:
    """Under ``catchup="latest"``: when firings after ``next_fire_at`` are due too, how
    many come before the latest due one, and that one (None: ``next_fire_at`` is it)."""
    assert state.next_fire_at is not None
    if (after := c.next_after(state.next_fire_at)) is None or after > now:
        return None
    latest, count = c.latest(state.next_fire_at - ONE, now, MAX_MISSED_COUNTED)
    assert latest is not None
    return max(count - 1, 1), latest


async def tick(
    world: contract.World,
    schedules: contract.Schedules,
    start: firing.Starter,
    record: records.ScheduleRecord,
    now: datetime,
) -> Look:
    """Handle what is due of one schedule at ``now``."""
    name = record.name
    c = spec_.parsed(record.spec)
    window = timedelta(seconds=record.spec.catchup_window_seconds)
    for _ in range(MAX_ACTIONS_PER_TICK):
        previous = await firing.settle(world, start, record)
        state = record.state
        claimed: firing.Claimed | None
        if state.buffered_at is not None and previous in ("none", "ended"):
            unbuffered = dataclasses.replace(state, buffered_at=None)
            new = firing.claimed_state(unbuffered, name, state.buffered_at, "start")
            claimed = await firing.claim(schedules, record, new, "start")
        elif state.paused or state.next_fire_at is None:
            watch = state.last_run_id if state.buffered_at is not None else None
            return Look(None, watch)
        elif state.next_fire_at > now:
            watch = state.last_run_id if state.buffered_at is not None else None
            return Look(state.next_fire_at, watch)
        elif state.next_fire_at < now - window:
            missed, due = skip_missed(c, state.next_fire_at, now - window)
            new = dataclasses.replace(state, next_fire_at=due, missed=state.missed + missed)
            claimed = await firing.claim(schedules, record, new, "skip")
            if claimed is not None:
                log.warning(
                    "schedule %s: %d firing(s) from %s were older than the catch-up window "
                    "(%s s) and were skipped", name, missed, state.next_fire_at.isoformat(),
                    record.spec.catchup_window_seconds,
                )  # fmt: skip
        elif record.spec.catchup == "latest" and (later := _latest_due(c, state, now)):
            # CronJob's rule: of the due firings only the latest fires; the rest are missed.
            missed, due = later
            new = dataclasses.replace(state, next_fire_at=due, missed=state.missed + missed)
            claimed = await firing.claim(schedules, record, new, "skip")
            if claimed is not None:
                log.warning(
                    "schedule %s: %d firing(s) from %s passed over (catchup latest): only "
                    "the latest, %s, fires", name, missed, state.next_fire_at.isoformat(),
                    due.isoformat(),
                )  # fmt: skip
        else:
            t = state.next_fire_at
            decision = firing.decide(record.spec.overlap, previous, state.buffered_at is not None)
            new = firing.claimed_state(state, name, t, decision)
            new = dataclasses.replace(new, next_fire_at=c.next_after(t))
            claimed = await firing.claim(schedules, record, new, decision)
            if claimed is not None and decision in ("skip", "buffer"):
                log.info("schedule %s: the firing at %s: %s (overlap %s)", name,
                         t.isoformat(), decision, record.spec.overlap)  # fmt: skip
        if claimed is None:
            try:  # another scheduler wrote first: read what it wrote, and go on from there
                record = await schedules.get(name)
            except errors.ScheduleNotFound:
                return Look(None)
            continue
        await firing.act(world, start, claimed)
        record = claimed.record
    return Look(now)


class FiringLoop:
    """One worker's firing loop over the World's schedules (see the module docstring)."""

    def __init__(
        self,
        world: contract.World,
        schedules: contract.Schedules,
        start: firing.Starter,
        *,
        serves: set[str],
        rescan_seconds: float,
        poll_seconds: float = 1.0,
        deployment_id: str | None = None,
    ) -> None:
        self.world = world
        self.deployment_id = deployment_id  # a schedule pinned elsewhere is not fired here
        self.schedules = schedules
        self.start_run = start
        self.serves = serves
        self.rescan_seconds = rescan_seconds
        self.poll_seconds = poll_seconds
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._watches: dict[str, asyncio.Task[None]] = {}
        self.passes = 0  # passes made (tests read it: the loop sleeps between them)
        self.passed = asyncio.Event()  # set after each pass (tests wait on it)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="treadle-schedules")

    def wake(self) -> None:
        """Look at the schedules again now (one changed)."""
        self._wake.set()

    async def stop(self) -> None:
        """Cancel the loop and its watches, cancelling again any that goes on: a
        cancellation swallowed inside a pass (a World client's own wait that absorbs it)
        must not hang the worker's close (seen once in the full suite: a teardown
        waited 300 s)."""
        tasks = {t for t in (self._task, *self._watches.values()) if t is not None}
        self._task = None
        self._watches.clear()
        for _ in range(STOP_TRIES):
            for task in tasks:
                task.cancel()
            if not tasks:
                return
            done, tasks = await asyncio.wait(tasks, timeout=STOP_WAIT_SECONDS)
            for task in done:  # read, so asyncio never reports an error as unretrieved
                if not task.cancelled():
                    task.exception()
        for task in tasks:
            log.warning("the schedules' firing loop task %s did not stop; left", task.get_name())

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                wake_at = await self.pass_once()
            except Exception:  # a World outage: logged, tried again; never a crash
                log.exception("the schedules' firing loop failed a pass; retrying")
                wake_at = clock.utcnow() + timedelta(seconds=ERROR_RETRY_SECONDS)
            delay = self.rescan_seconds
            if wake_at is not None:
                delay = min(delay, max((wake_at - clock.utcnow()).total_seconds(), 0.0))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    async def pass_once(self) -> datetime | None:
        """One pass over every schedule; the soonest time a schedule next needs a look."""
        self.passes += 1
        soonest: datetime | None = None
        for record in await self.schedules.list():
            if record.spec.workflow_name not in self.serves:
                continue
            if self.deployment_id is not None and record.spec.deployment_id not in (
                None,
                self.deployment_id,
            ):
                continue  # pinned to another deployment: its workers fire it
            try:
                look = await tick(self.world, self.schedules, self.start_run, record,
                                  clock.utcnow())  # fmt: skip
            except Exception:
                log.exception("schedule %s: a pass failed; retrying", record.name)
                look = Look(clock.utcnow() + timedelta(seconds=ERROR_RETRY_SECONDS))
            if look.watch_run_id is not None:
                self._watch(look.watch_run_id)
            if look.at is not None and (soonest is None or look.at < soonest):
                soonest = look.at
        self.passed.set()
        return soonest

    def _watch(self, run_id: str) -> None:
        """Wake the loop when ``run_id`` ends (a buffered firing waits on it)."""
        if run_id in self._watches:
            return

        async def wait() -> None:
            try:
                await resultwait.RunEnd(self.world, run_id, self.poll_seconds).wait(None)
            except Exception:
                log.exception("run %s: the schedules' wait on its end failed", run_id)
            self._watches.pop(run_id, None)
            self.wake()

        self._watches[run_id] = asyncio.create_task(wait(), name=f"treadle-schedule-{run_id}")


def start_for(rt: Runtime) -> FiringLoop | None:
    """A worker's firing loop over its World's schedules (None: the World has none, or
    ``TREADLE_SCHEDULES_ENABLED`` is off), started; it fires the schedules of the
    workflows it serves that name no deployment (their runs start on the worker's own)
    or name its own."""
    table = getattr(rt.world, "schedules", None)
    if not rt.settings.TREADLE_SCHEDULES_ENABLED or not isinstance(table, contract.Schedules):
        return None
    world, settings = rt.world, rt.settings
    limits_ = limits.Limits.from_settings(settings)

    async def start(spec: records.ScheduleSpec, run_id: str, fire_at: datetime) -> None:
        from treadle import client  # the client imports the worker, which imports this

        try:
            await client.start_run(
                world, name=spec.workflow_name, data=spec.input,
                deployment_id=spec.deployment_id or rt.deployment_id,
                spec_version=client.minted_spec_version(settings, world), run_id=run_id,
                attributes=firing.attributes_for(spec.name, fire_at), limits_=limits_,
            )  # fmt: skip
        except errors.WorldContractError:
            log.info("run %s: fired already by schedule %s", run_id, spec.name)

    loop = FiringLoop(
        world, table, start, serves=set(rt.workflows),
        rescan_seconds=settings.TREADLE_SCHEDULES_RESCAN_SECONDS,
        poll_seconds=settings.TREADLE_RESULT_POLL_SECONDS, deployment_id=rt.deployment_id,
    )  # fmt: skip
    loop.start()
    return loop
