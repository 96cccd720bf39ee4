"""WorkflowRun status, kept in step with the event log without polling runs.

``StatusSync`` watches each World's changes feed (``contract.Changes``: "run X
has events up to slot N", world-wide) once per World. A report for a run some
WorkflowRun tracks marks it dirty, and one refresher task folds the new events
(``RunView``), reads the run's record, and patches the object's status when it
changed, posting an Event when the phase does. Nothing else is read: a quiet
run costs nothing. Status patches are paced (``debounce``): a phase change at
once, anything else at most once per interval per object, the pending change
written when the interval is up, so the final status is exact.

When the World says reports may have been missed (``on_resync``: its feed was
lost and is back), every tracked run on that World is marked dirty. The same
catch-up runs for each run when the operator starts (kopf lists the objects,
``track`` marks them dirty).

A creation report for a run nobody tracks is a run started elsewhere: it is
handed to ``on_new_run`` (which may mirror it as a WorkflowRun) only when
``mirrors(deployment_id)`` says some WorkflowDeployment of that deployment has
``mirrorRuns`` (review R5 (d)); every World names the deployment in a creation
report (Postgres since migration 0007), and one that did not would be asked
only while some deployment mirrors at all.

The operator speaks to the World only through ``treadle.world.contract`` here
(architecture review item 1), so this logic runs on the local World in tests
(``tests/operator/test_sync_local.py``). Kubernetes is reached through a
``StatusSink`` (``kube.Kube`` is one). When a World object is replaced (its
Secret rotated), ``repoint`` moves the runs tracked on the old one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from treadle import errors as engine_errors
from treadle import payloads
from treadle.world import contract, events
from treadle_operator import attrlabels, debounce, metrics, models, runstatus
from treadle_operator.models import WorkflowRunStatus
from treadle_operator.progress import RunView, status_of

log = logging.getLogger("treadle.operator.sync")

RECONNECT_SECONDS = 2.0
PLURAL = "workflowruns"
# The events that may change a run's phase: a refresh that saw none while a paced
# patch is pending leaves the reading of the run to that patch.
PHASE_EVENTS = frozenset({"run_started", *events.RUN_TERMINAL_TYPES})

OnNewRun = Callable[[contract.World, str], Awaitable[None]]
Mirrors = Callable[[str | None], bool]


class StatusSink(Protocol):
    """Where StatusSync writes (``kube.Kube``; a test may record instead)."""

    async def patch_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any]
    ) -> bool: ...

    async def patch_labels(
        self, plural: str, namespace: str, name: str, labels: dict[str, str | None]
    ) -> bool: ...

    async def event(
        self, obj: dict[str, Any], reason: str, message: str, *, warning: bool = False
    ) -> None: ...


@dataclass
class Tracked:
    namespace: str
    name: str
    world: contract.World
    status: WorkflowRunStatus  # what the next status is built on
    shown: WorkflowRunStatus  # what the object's status says (last patched)
    view: RunView = field(default_factory=RunView)
    body: dict[str, Any] = field(default_factory=dict)
    keys: payloads.KeyRing | None = None  # the deployment's payload keys, to show output
    attributes: dict[str, Any] | None = None  # the run's, as last read (None: not yet)


class StatusSync:
    def __init__(
        self,
        sink: StatusSink,
        on_new_run: OnNewRun | None = None,
        *,
        interval: float = debounce.DEFAULT_INTERVAL_SECONDS,
        mirrors: Mirrors | None = None,
    ) -> None:
        self._sink = sink
        self.on_new_run = on_new_run
        self.mirrors = mirrors
        self._pacer = debounce.Pacer(interval)
        self._runs: dict[str, Tracked] = {}
        self._dirty: set[str] = set()
        self._later: dict[str, asyncio.TimerHandle] = {}
        self._wake = asyncio.Event()
        self._watches: dict[int, tuple[contract.World, contract.Subscription | None]] = {}
        self._watching: set[asyncio.Task[None]] = set()
        self._refresher: asyncio.Task[None] | None = None
        self._closed = False

    # -- what is tracked ---------------------------------------------------------------------

    def track(
        self,
        run_id: str,
        world: contract.World,
        body: dict[str, Any],
        status: WorkflowRunStatus,
        keys: payloads.KeyRing | None = None,
        *,
        shown: WorkflowRunStatus | None = None,
    ) -> None:
        """Keep this WorkflowRun's status in step with ``run_id`` (refreshing it now).

        ``status`` is what the next status builds on; ``shown`` what the object's
        status says now when that differs (not yet patched), so the first refresh
        writes both at once.
        """
        meta = body.get("metadata", {})
        known = self._runs.get(run_id)
        if known is None:
            self._runs[run_id] = Tracked(
                meta["namespace"],
                meta["name"],
                world,
                status,
                shown if shown is not None else status,
                body=body,
                keys=keys,
            )
            self.poke(run_id)
        else:
            known.body = body
            if known.world is not world:
                known.world = world
                self.poke(run_id)

    def update_body(self, run_id: str, body: dict[str, Any]) -> None:
        """The object as last seen (Events name it)."""
        known = self._runs.get(run_id)
        if known is not None:
            known.body = body

    def untrack(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
        self._dirty.discard(run_id)
        self._pacer.forget(run_id)
        timer = self._later.pop(run_id, None)
        if timer is not None:
            timer.cancel()

    def tracks(self, run_id: str) -> bool:
        return run_id in self._runs

    def tracked(self, run_id: str) -> Tracked | None:
        return self._runs.get(run_id)

    def count(self) -> int:
        """How many runs are tracked (the ``treadle_operator_tracked_runs`` gauge)."""
        return len(self._runs)

    def poke(self, run_id: str) -> None:
        self._dirty.add(run_id)
        self._wake.set()
        if self._refresher is None and not self._closed:
            self._refresher = asyncio.get_running_loop().create_task(
                self._refresh_forever(), name="treadle-operator-status-sync"
            )

    def _poke_world(self, world: contract.World) -> None:
        for run_id, tracked in self._runs.items():
            if tracked.world is world:
                self.poke(run_id)

    # -- watching ----------------------------------------------------------------------------

    async def listen(self, _where: object, world: contract.World) -> None:
        """``Worlds``' ``on_opened`` hook: watch this World (``_where`` names it in logs)."""
        await self.watch(world)

    async def watch(self, world: contract.World) -> None:
        """Watch this World's changes (once per World object), retrying until it works."""
        if id(world) in self._watches or self._closed:
            return
        self._watches[id(world)] = (world, None)
        try:
            await self._subscribe(world)
        except engine_errors.WorldError as exc:
            log.warning("cannot watch the World's changes yet: %s; retrying", exc)
            task = asyncio.get_running_loop().create_task(
                self._subscribe_until_up(world), name="treadle-operator-watch"
            )
            self._watching.add(task)
            task.add_done_callback(self._watching.discard)

    async def _subscribe(self, world: contract.World) -> None:
        def on_change(change: contract.RunChanged) -> None:
            self._changed(world, change)

        def on_resync() -> None:
            log.info("the World's changes feed is back: refreshing every tracked run")
            self._poke_world(world)

        sub = await world.changes.watch(on_change, on_resync)
        if self._closed or id(world) not in self._watches:
            sub.close()
            return
        self._watches[id(world)] = (world, sub)

    async def _subscribe_until_up(self, world: contract.World) -> None:
        while not self._closed and id(world) in self._watches:
            await asyncio.sleep(RECONNECT_SECONDS)
            try:
                await self._subscribe(world)
            except engine_errors.WorldError as exc:
                log.warning("cannot watch the World's changes yet: %s; retrying", exc)
                continue
            self._poke_world(world)  # what changed before the watch began
            return

    def _changed(self, world: contract.World, change: contract.RunChanged) -> None:
        if change.run_id in self._runs:
            self.poke(change.run_id)
        elif change.created and self.on_new_run is not None:
            if self.mirrors is not None and not self.mirrors(change.deployment_id):
                return  # nobody mirrors this deployment's runs: not even a read
            task = asyncio.get_running_loop().create_task(self._new_run(world, change.run_id))
            self._watching.add(task)
            task.add_done_callback(_log_failure)
            task.add_done_callback(self._watching.discard)

    async def _new_run(self, world: contract.World, run_id: str) -> None:
        assert self.on_new_run is not None
        await self.on_new_run(world, run_id)

    async def repoint(self, old: contract.World, new: contract.World) -> None:
        """``old`` was replaced by ``new`` (its Secret rotated): the runs tracked on it
        follow ``new``, which is watched instead, and are refreshed from it."""
        entry = self._watches.pop(id(old), None)
        if entry is not None and entry[1] is not None:
            entry[1].close()
        await self.watch(new)
        for tracked in self._runs.values():
            if tracked.world is old:
                tracked.world = new
        self._poke_world(new)

    # -- refreshing --------------------------------------------------------------------------

    async def _refresh_forever(self) -> None:
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            batch, self._dirty = self._dirty, set()
            failed: set[str] = set()
            for run_id in batch:
                try:
                    await self.refresh(run_id)
                except Exception as exc:  # one run's trouble never stops the others
                    log.warning("cannot refresh the status of run %s: %s", run_id, exc)
                    failed.add(run_id)
            if failed:  # retried after a pause; runs poked meanwhile are refreshed at once
                await asyncio.sleep(RECONNECT_SECONDS)
                self._dirty |= failed
                self._wake.set()
            elif self._dirty:
                self._wake.set()

    def _due(self, run_id: str) -> None:
        self._later.pop(run_id, None)
        if run_id in self._runs:
            self.poke(run_id)

    async def refresh(self, run_id: str) -> None:
        tracked = self._runs.get(run_id)
        if tracked is None:
            return
        world = tracked.world
        phase_news = await self._catch_up(run_id, tracked)
        if run_id in self._later and not phase_news:
            return  # a paced patch is due anyway: it reads the run then
        try:
            run = await world.runs.get(run_id)
        except engine_errors.RunNotFound:
            return
        if run.is_terminal and not tracked.view.finished:
            # It ended between the two reads: its last events (the final step's outcome)
            # are in the log now, and a finished status must count them.
            await self._catch_up(run_id, tracked)
        tracked.attributes = dict(run.attributes)
        status = runstatus.present_for(
            tracked.body, status_of(run, tracked.view, tracked.status, keys=tracked.keys)
        )
        if status == tracked.shown:
            tracked.status = status
            return
        before = tracked.shown.phase
        loop = asyncio.get_running_loop()
        wait = self._pacer.delay(run_id, loop.time(), phase_changed=status.phase != before)
        if wait > 0:
            if run_id not in self._later:
                self._later[run_id] = loop.call_later(wait, self._due, run_id)
            return
        await self._write(run_id, tracked, status, before)

    async def _catch_up(self, run_id: str, tracked: Tracked) -> bool:
        """Fold the run's events past the view into it; True if one changes its phase."""
        phase_news = False
        while True:
            page = await tracked.world.events.list(run_id, after_slot=tracked.view.after_slot)
            for logged in page.events:
                tracked.view.apply(logged)
                phase_news = phase_news or logged.event.type in PHASE_EVENTS
            if not page.has_more or not page.events:
                return phase_news

    async def _write(
        self, run_id: str, tracked: Tracked, status: WorkflowRunStatus, before: str
    ) -> None:
        timer = self._later.pop(run_id, None)
        if timer is not None:
            timer.cancel()
        # Labels first, then the status: whoever sees the new condition (``kubectl wait
        # --for=condition=Succeeded``) then finds the phase label to match (``-l
        # treadle.dev/phase=Completed``); the other order let a reader see them disagree.
        deployment = str((tracked.body.get("spec") or {}).get("deployment") or "")
        have = (tracked.body.get("metadata") or {}).get("labels") or {}
        wanted: dict[str, str | None] = {}
        if tracked.attributes is not None:  # issue 17 item 2: attrlabels
            wanted.update(attrlabels.wanted(have, tracked.attributes))
        wanted.update(runstatus.labels(deployment, status))
        labels = runstatus.label_patch(tracked.body, wanted)
        if labels and await self._sink.patch_labels(
            PLURAL, tracked.namespace, tracked.name, labels
        ):
            meta = tracked.body.setdefault("metadata", {})
            merged = {**(meta.get("labels") or {}), **labels}
            meta["labels"] = {k: v for k, v in merged.items() if v is not None}
        wire = models.dump(status)
        if not await self._sink.patch_status(PLURAL, tracked.namespace, tracked.name, wire):
            self.untrack(run_id)
            return
        self._pacer.patched(run_id, asyncio.get_running_loop().time())
        tracked.status = tracked.shown = status
        if status.phase != before and status.phase in models.FINISHED_PHASES:
            metrics.RUNS_FINISHED.inc(namespace=tracked.namespace, phase=status.phase)
        # A mirrored run (started from code) gets an Event only when it fails (R5 (e)).
        if status.phase != before and (not status.mirrored or status.phase == "Failed"):
            message = f"run {run_id} is {status.phase.lower()}"
            if status.error is not None:
                message += f": {status.error.type}: {status.error.message}"
            await self._sink.event(
                tracked.body, status.phase, message, warning=status.phase == "Failed"
            )

    async def close(self) -> None:
        self._closed = True
        for timer in self._later.values():
            timer.cancel()
        self._later.clear()
        for _, sub in self._watches.values():
            if sub is not None:
                sub.close()
        self._watches.clear()
        tasks = [*self._watching]
        if self._refresher is not None:
            tasks.append(self._refresher)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("mirroring a run failed: %s", task.exception())
