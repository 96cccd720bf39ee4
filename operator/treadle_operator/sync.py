"""WorkflowRun status, kept in step with the event log without polling runs.

Every committed event NOTIFYs ``treadle_events`` with ``run_id:slot`` (see
``treadle.worlds.postgres.feed``). ``StatusSync`` LISTENs once per World; a
notification for a run some WorkflowRun tracks marks it dirty, and one
refresher task folds the new events (``RunView``), reads the run's record,
and patches the object's status when it changed, posting an Event when the
phase does. Nothing else is read: a quiet run costs nothing.

When a LISTEN connection is lost, every tracked run on that World is marked
dirty once it is back, so a notification missed in between loses nothing.
The same catch-up runs for each run when the operator starts (kopf lists the
objects, ``track`` marks them dirty).

A notification at slot 1 for a run nobody tracks is a run started elsewhere:
when its revision's WorkflowDeployment asks for ``mirrorRuns``, ``on_new_run``
makes a WorkflowRun for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from treadle import errors as engine_errors
from treadle import payloads
from treadle.worlds.postgres.feed import CHANNEL
from treadle.worlds.production import PostgresNatsWorld
from treadle_operator import metrics, models, runstatus
from treadle_operator.kube import Kube
from treadle_operator.models import WorkflowRunStatus
from treadle_operator.progress import RunView, status_of
from treadle_operator.worlds import WorldUrls

log = logging.getLogger("treadle.operator.sync")

RECONNECT_SECONDS = 2.0
HEARTBEAT_SECONDS = 10.0

OnNewRun = Callable[[PostgresNatsWorld, str], Awaitable[None]]


@dataclass
class Tracked:
    namespace: str
    name: str
    world: PostgresNatsWorld
    status: WorkflowRunStatus
    view: RunView = field(default_factory=RunView)
    body: dict[str, Any] = field(default_factory=dict)
    keys: payloads.KeyRing | None = None  # the deployment's payload keys, to show output


class StatusSync:
    def __init__(self, kube: Kube, on_new_run: OnNewRun | None = None) -> None:
        self._kube = kube
        self.on_new_run = on_new_run
        self._runs: dict[str, Tracked] = {}
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._listeners: dict[WorldUrls, asyncio.Task[None]] = {}
        self._refresher: asyncio.Task[None] | None = None
        self._closed = False

    # -- what is tracked ---------------------------------------------------------------------

    def track(
        self,
        run_id: str,
        world: PostgresNatsWorld,
        body: dict[str, Any],
        status: WorkflowRunStatus,
        keys: payloads.KeyRing | None = None,
    ) -> None:
        """Keep this WorkflowRun's status in step with ``run_id`` (refreshing it now)."""
        meta = body.get("metadata", {})
        known = self._runs.get(run_id)
        if known is None:
            self._runs[run_id] = Tracked(
                meta["namespace"], meta["name"], world, status, body=body, keys=keys
            )
            self.poke(run_id)
        else:
            known.body = body

    def update_body(self, run_id: str, body: dict[str, Any]) -> None:
        """The object as last seen (Events name it)."""
        known = self._runs.get(run_id)
        if known is not None:
            known.body = body

    def untrack(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
        self._dirty.discard(run_id)

    def tracks(self, run_id: str) -> bool:
        return run_id in self._runs

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

    # -- listening ---------------------------------------------------------------------------

    async def listen(self, urls: WorldUrls, world: PostgresNatsWorld) -> None:
        """LISTEN on this World's notifications (once per World)."""
        if urls in self._listeners or self._closed:
            return
        ready = asyncio.get_running_loop().create_future()
        self._listeners[urls] = asyncio.get_running_loop().create_task(
            self._listen_forever(urls, world, ready), name=f"treadle-operator-listen {urls}"
        )
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(ready), 10)

    async def _listen_forever(
        self, urls: WorldUrls, world: PostgresNatsWorld, ready: asyncio.Future[None]
    ) -> None:
        first = True
        while not self._closed:
            lost = asyncio.get_running_loop().create_future()

            def on_notify(_c: object, _p: int, _ch: str, payload: str) -> None:
                run_id, _, slot = payload.rpartition(":")
                if run_id in self._runs:
                    self.poke(run_id)
                elif slot == "1" and self.on_new_run is not None:
                    task = asyncio.get_running_loop().create_task(self._new_run(world, run_id))
                    task.add_done_callback(_log_failure)

            def on_lost(_c: object, lost: asyncio.Future[None] = lost) -> None:
                if not lost.done():
                    lost.set_result(None)

            try:
                conn = await asyncpg.connect(
                    urls.database_url, server_settings={"application_name": "treadle-operator"}
                )
            except (OSError, asyncpg.PostgresError) as exc:
                log.warning("cannot LISTEN on %s: %s; retrying", urls, exc)
                await asyncio.sleep(RECONNECT_SECONDS)
                continue
            try:
                conn.add_termination_listener(on_lost)
                await conn.add_listener(CHANNEL, on_notify)
                if not first:
                    log.info("LISTEN on %s is back: refreshing every tracked run", urls)
                for run_id, tracked in self._runs.items():
                    if tracked.world is world:
                        self.poke(run_id)
                first = False
                if not ready.done():
                    ready.set_result(None)
                while not lost.done():
                    done, _ = await asyncio.wait({lost}, timeout=HEARTBEAT_SECONDS)
                    if done:
                        break
                    try:
                        await conn.execute("SELECT 1", timeout=HEARTBEAT_SECONDS)
                    except (OSError, asyncpg.PostgresError, TimeoutError):
                        break
                log.warning("lost LISTEN on %s; reconnecting", urls)
            except (OSError, asyncpg.PostgresError) as exc:
                log.warning("LISTEN on %s failed: %s; reconnecting", urls, exc)
            finally:
                conn.terminate()
            await asyncio.sleep(RECONNECT_SECONDS)

    async def _new_run(self, world: PostgresNatsWorld, run_id: str) -> None:
        assert self.on_new_run is not None
        await self.on_new_run(world, run_id)

    # -- refreshing --------------------------------------------------------------------------

    async def _refresh_forever(self) -> None:
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            batch, self._dirty = self._dirty, set()
            for run_id in batch:
                try:
                    await self.refresh(run_id)
                except Exception as exc:  # one run's trouble never stops the others
                    log.warning("cannot refresh the status of run %s: %s", run_id, exc)
                    self._dirty.add(run_id)
            if self._dirty:
                await asyncio.sleep(RECONNECT_SECONDS)
                self._wake.set()

    async def refresh(self, run_id: str) -> None:
        tracked = self._runs.get(run_id)
        if tracked is None:
            return
        world = tracked.world
        while True:
            page = await world.events.list(run_id, after_slot=tracked.view.after_slot)
            for logged in page.events:
                tracked.view.apply(logged)
            if not page.has_more or not page.events:
                break
        try:
            run = await world.runs.get(run_id)
        except engine_errors.RunNotFound:
            return
        generation = (tracked.body.get("metadata") or {}).get("generation")
        status = runstatus.present(
            status_of(run, tracked.view, tracked.status, keys=tracked.keys), generation
        )
        if status == tracked.status:
            return
        before = tracked.status.phase
        wire = models.dump(status)
        if not await self._kube.patch_status("workflowruns", tracked.namespace, tracked.name, wire):
            self.untrack(run_id)
            return
        tracked.status = status
        deployment = str((tracked.body.get("spec") or {}).get("deployment") or "")
        labels = runstatus.label_patch(tracked.body, runstatus.labels(deployment, status))
        if labels and await self._kube.patch_labels(
            "workflowruns", tracked.namespace, tracked.name, labels
        ):
            meta = tracked.body.setdefault("metadata", {})
            merged = {**(meta.get("labels") or {}), **labels}
            meta["labels"] = {k: v for k, v in merged.items() if v is not None}
        if status.phase != before:
            if status.phase in models.FINISHED_PHASES:
                metrics.RUNS_FINISHED.inc(namespace=tracked.namespace, phase=status.phase)
            message = f"run {run_id} is {status.phase.lower()}"
            if status.error is not None:
                message += f": {status.error.type}: {status.error.message}"
            await self._kube.event(
                tracked.body, status.phase, message, warning=status.phase == "Failed"
            )

    async def close(self) -> None:
        self._closed = True
        tasks = [*self._listeners.values()]
        if self._refresher is not None:
            tasks.append(self._refresher)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._listeners.clear()


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("mirroring a run failed: %s", task.exception())
