"""Simulated worker processes: a real Runtime + Worker each, that can die or stall.

A ``Process`` is one worker: its own ``MemoryWorld`` view over the shared
``MemoryBackend`` (so its own interceptor), a real
``treadle.orchestrator.runtime.Runtime`` and ``Worker``, and every task it
spawned (recorded through the loop's task factory, by the ``current_process``
context variable every task of the process inherits), under a worker identity
(its own, or a dead process's when it restarts in place). ``kill()`` marks it dead
(its interceptor raises ``ProcessKilled`` from then on, so no cleanup write
escapes), abandons its deliveries (``consumer.kill()``: their leases lapse and
they come back) and cancels its tasks. ``stall(seconds)`` blocks every World call
it makes until then, after its lease lapsed; it must find itself fenced.

``ProcessInterceptor`` is the ``treadle.testing.memory`` interceptor of one
process: it applies death and stalls, then asks the ``faults.Injector`` what to
do at this point. Used by the runner.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from treadle import clock, errors
from treadle.client import Workflows
from treadle.orchestrator.worker import Worker
from treadle.testing.memory.consumer import current_delivery
from treadle.testing.simulation import gen_streams
from treadle.testing.simulation.workload import DeliveryRun, current_process

log = logging.getLogger("treadle.testing.simulation")

Interference = Literal["proceed", "lose", "fail_after"]

# The World calls an orchestrator delivery must not make once told its lease lapsed
# (issue 10, F3: no write). Reads are not checked: a read retried after a timeout and
# the first load of a delivery whose lease lapsed before its handler ran still happen
# (harmless; found_seeds.md "open"). Settling and sends of what it owes stay allowed.
_STOPPED_POINTS = frozenset({"events.create", "events.create_batch"})
# The share of won schedule claims a seed whose plan kills kills right after (its budget
# allowing): the window a claim's last_run_id repairs (gen_schedules).
CLAIM_KILL_SHARE = 0.1


@dataclass
class IgnoredLease:
    """A World call an orchestrator delivery made after it was told its lease lapsed."""

    at: float
    told_at: float
    point: str
    run_id: str
    message_id: str
    process: str

    def __str__(self) -> str:
        return (
            f"{self.process}'s delivery of {self.message_id} called {self.point} at "
            f"{self.at:.3f}, told at {self.told_at:.3f} that its lease lapsed"
        )


class ProcessKilled(BaseException):
    """Raised inside a killed simulated process at its next World call (never caught)."""


class Process:
    """One simulated worker process."""

    def __init__(self, name: str, sim: Any, worker_id: str | None = None) -> None:
        self.name = name
        self.sim = sim  # the runner's Simulation (backend, injector, loop, settings)
        # Its TREADLE_WORKER_ID: its own, or a dead process's (a restart in place, which
        # releases at once what that one held: ``treadle.world.liveness``).
        self.worker_id = worker_id or f"worker-{name}"
        self.dead = False
        self.stalled_until: float | None = None
        self._unstalled = asyncio.Event()
        self._unstalled.set()
        self.tasks: dict[asyncio.Task[Any], None] = {}  # ordered, unlike a set
        self.context = contextvars.copy_context()
        self.context.run(current_process.set, name)
        # A process spawned from a dying delivery (a kill at its World call: ``on_kill``)
        # must not inherit it: its tasks outside deliveries (the schedules' firing loop)
        # would be taken for that delivery, told its lease lapsed (seed 30).
        self.context.run(current_delivery.set, None)
        self.interceptor = ProcessInterceptor(self)
        self.world: Any = None
        self.worker: Worker | None = None
        self.killed_at: float | None = None
        self.stalls: list[tuple[float, float]] = []

    def adopt(self, task: asyncio.Task[Any]) -> None:
        self.tasks[task] = None
        task.add_done_callback(lambda t: self.tasks.pop(t, None))

    async def start(self, app: Workflows) -> None:
        from treadle.testing.memory import MemoryWorld

        tuning = dataclasses.replace(self.sim.backend.tuning, worker_id=self.worker_id)
        self.world = MemoryWorld(
            self.sim.backend, tuning=tuning, interceptor=self.interceptor, name=self.name
        )
        worker = Worker(app.runtime(self.world), role="all", concurrency=self.sim.concurrency)
        self.worker = worker
        task = asyncio.get_running_loop().create_task(worker.start(), context=self.context)
        await asyncio.wait([task])
        task.result()

    def kill(self, now: float) -> None:
        if self.dead:
            return
        self.dead = True
        self.killed_at = now
        log.info("process %s killed at %.3f", self.name, now)
        consumer = getattr(self.worker, "_consumer", None)
        kill = getattr(consumer, "kill", None)
        if kill is not None:
            kill()
        current = asyncio.current_task()
        for task in list(self.tasks):
            if task is not current and not task.done():
                task.cancel()
        self._unstalled.set()

    def stall(self, now: float, seconds: float) -> None:
        if self.dead or self.stalled_until is not None:
            return
        self.stalled_until = now + seconds
        self.stalls.append((now, now + seconds))
        self.sim.ownership_lost.append((now, None))  # its leases lapse: every run it held
        self._unstalled.clear()
        log.info("process %s stalled at %.3f for %.1f s", self.name, now, seconds)
        asyncio.get_running_loop().call_later(seconds, self._resume)

    def _resume(self) -> None:
        self.stalled_until = None
        self._unstalled.set()

    def lost_ownership(self, start: float, end: float | None) -> bool:
        """Was this process dead or stalled at some point of [start, end]?"""
        stop = float("inf") if end is None else end
        if self.killed_at is not None and self.killed_at <= stop:
            return True
        return any(s <= stop and e >= start for s, e in self.stalls)


class ProcessInterceptor:
    """The fault point of one process: death, stalls, then the injector's draw."""

    def __init__(self, process: Process) -> None:
        self.process = process

    async def before(self, point: str, run_id: str | None) -> Interference:
        proc = self.process
        if proc.dead:
            raise ProcessKilled(proc.name)
        self._check_lease(point)
        self._record_delivery(point)
        if proc.stalled_until is not None:
            await proc._unstalled.wait()
            if proc.dead:
                raise ProcessKilled(proc.name)
        sim = proc.sim
        now = asyncio.get_running_loop().time()
        if point == "schedules.claimed":
            # A scheduler dead between its claim and its run's start (gen_schedules): often
            # enough to bite on a seed whose plan kills, from a stream of its own.
            kills = sim.injector.plan.rates.get("kill", 0.0) > 0
            drawn = kills and sim.claim_kills.random() < CLAIM_KILL_SHARE
            if drawn and sim.injector.take("kill", point, None, proc.name, now):
                sim.on_kill(proc)
                raise ProcessKilled(proc.name)
            return "proceed"
        kind = sim.injector.choose(point, run_id, proc.name, now)
        if kind is None and self._fence_first_write(point, run_id, now):
            kind = "fence"  # gen_streams.stream_fences: taken from the budget already
        if kind is None:
            return "proceed"
        if kind == "stall":
            proc.stall(now, sim.stall_seconds())
            await proc._unstalled.wait()  # this very call waits out the stall
            if proc.dead:
                raise ProcessKilled(proc.name)
            return "proceed"
        if kind == "fence":
            # The lease lapses and this write waits until the redelivery wrote in-band,
            # so the fence refuses it (or it lands stale, if nothing came in time).
            if sim.force_lapse(run_id, proc):
                await sim.until_written(run_id)
            if proc.dead:
                raise ProcessKilled(proc.name)
            return "proceed"
        return self._apply(kind, point, run_id, now)

    def _fence_first_write(self, point: str, run_id: str | None, now: float) -> bool:
        """A fence on the first write after ``run_created`` (turbo's ``run_started``, the
        first step's start) of a run whose first step writes a stream, on a share of
        them (``gen_streams.FENCE_SHARE``, a stream of its own): its early body's
        chunks must then be refused (the run-ready barrier, the World's attempt rule)."""
        sim = self.process.sim
        if point not in ("events.create", "events.create_batch") or run_id is None:
            return False
        if run_id not in sim.stream_first or sim.injector.plan.rates.get("fence", 0.0) <= 0:
            return False
        if len(sim.backend.events_of(run_id)) != 1:
            return False
        sim.stream_first.discard(run_id)  # one draw per run
        if sim.stream_fences.random() >= gen_streams.FENCE_SHARE:
            return False
        return bool(sim.injector.take("fence", point, run_id, self.process.name, now))

    def _check_lease(self, point: str) -> None:
        """Record a call a delivery makes although it knows its lease lapsed (F3)."""
        leased = current_delivery.get()
        if leased is None or leased.kind != "orchestrator" or point not in _STOPPED_POINTS:
            return
        now = clock.monotonic()
        if leased.lost.at is not None and leased.lost.known_before(now):
            offset = now - asyncio.get_running_loop().time()
            self.process.sim.ignored_leases.append(
                IgnoredLease(
                    now - offset, leased.lost.at - offset, point, leased.run_id,
                    leased.message_id, self.process.name,
                )
            )  # fmt: skip

    def _record_delivery(self, point: str) -> None:
        """A delivery's start (``queue.deliver``) and settlement, in the ledger."""
        leased = current_delivery.get()
        if leased is None or point not in ("queue.deliver", "queue.settle"):
            return
        ledger = self.process.sim.ledger
        now = asyncio.get_running_loop().time()
        if point == "queue.deliver":
            ledger.deliveries[leased.token] = DeliveryRun(
                leased.run_id, leased.message_id, leased.token, self.process.name, now
            )
        elif (known := ledger.deliveries.get(leased.token)) is not None and known.settled is None:
            known.settled = now

    def _apply(self, kind: str, point: str, run_id: str | None, now: float) -> Interference:
        proc, sim = self.process, self.process.sim
        if kind in ("kill", "lost_wake"):
            sim.on_kill(proc)
            raise ProcessKilled(proc.name)
        if kind == "storage_error":
            raise errors.StorageUnavailable(f"simulated storage failure at {point}")
        if kind == "queue_error":
            raise ConnectionError(f"simulated queue failure at {point}")
        if kind == "fail_after":
            return "fail_after"
        if kind in ("duplicate", "lapse"):
            sim.force_lapse(run_id, proc)
            return "proceed"
        if kind == "feed_drop":
            sim.backend.drop_feeds(run_id)
            return "proceed"
        return "proceed"


TaskRecorder = Callable[[asyncio.Task[Any]], None]


def task_recorder(processes: dict[str, Process]) -> TaskRecorder:
    """The loop's ``on_task``: file every task under the process that spawned it."""

    def record(task: asyncio.Task[Any]) -> None:
        name = task.get_context().get(current_process)  # type: ignore[attr-defined]
        if name is not None and name in processes:
            processes[name].adopt(task)

    return record
