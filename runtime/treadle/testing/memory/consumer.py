"""The in-memory World's consumer: takes due messages and runs handlers on the loop.

One ``MemoryConsumer`` per ``queue.consume`` call. Its loop claims what is due
(``queue.MessageQueue.claim``), starts a task per delivery, and waits until a
send, a settlement or the next due time (an asyncio timer) wakes it. A delivery
renews its lease every third of it while the handler runs; a handler that holds
the loop past its lease loses it, and its late answer is dropped. When a
delivery's ack is refused because messages were coalesced into it, the handler
runs again in the same delivery (``delivery_count + rerun``, same ``attempt``),
up to ``MAX_COALESCED_RERUNS`` times, then the message is handed off.

The World's interceptor is awaited before each delivery (``queue.deliver``),
settlement (``queue.settle``), renewal (``queue.renew``) and worker heartbeat
(``queue.beat``, once a second: ``treadle.world.liveness``; a consumer started with
``tuning.worker_id`` first releases what another World's consumer of that identity
holds: a restart in place). ``kill()`` is a process dying: no more claims, no
heartbeats, nothing settled; its leases lapse past its liveness.

Started by ``storage.MemoryQueue.consume``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging

from treadle import clock, errors
from treadle.testing.memory import points as fault_points
from treadle.testing.memory.queue import MIN_WAIT_SECONDS, Leased, MessageQueue, Settled
from treadle.world import contract, liveness, messages, queuerules

log = logging.getLogger("treadle.testing.memory.consumer")

# The delivery whose handler runs the current task (and every task it spawned), or
# None: the simulation reads it to check what a delivery does once told its lease lapsed.
current_delivery: contextvars.ContextVar[Leased | None] = contextvars.ContextVar(
    "treadle_memory_delivery", default=None
)


class MemoryConsumer:
    """Delivers one World's share of the backend's messages (see the module docstring)."""

    def __init__(
        self,
        queue: MessageQueue,
        handlers: dict[messages.MessageKind, contract.Handler],
        concurrency: int,
        *,
        tuning: contract.QueueTuning,
        points: fault_points.Points,
        world: str,
        name: str,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if not handlers:
            raise ValueError("consume needs at least one handler")
        self._queue = queue
        self._handlers = handlers
        self._kinds = tuple(sorted(handlers))
        self._concurrency = concurrency
        self._tuning = tuning
        self._points = points
        self.world = world
        self.name = name
        # No random draw for an unnamed worker: the simulation's ids stay where they were.
        self.worker = tuning.worker_id or name
        self._liveness = tuning.liveness_seconds
        self._beat_task: asyncio.Task[None] | None = None
        self._busy = asyncio.Event()
        self._parked = True
        self._wake = asyncio.Event()
        self._running: dict[asyncio.Task[None], Leased] = {}
        self._heartbeats: dict[asyncio.Task[None], None] = {}  # ordered, unlike a set
        self.closing = False
        self.killed = False
        self._loop_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._tuning.worker_id:
            self._queue.release_worker(self.worker, self.world)  # restart in place
        self._queue.listen(self._wake)
        loop = asyncio.get_running_loop()
        self._loop_task = loop.create_task(
            self._dispatch(), name=f"treadle-memory-dispatch-{self.name}"
        )
        self._beat_task = loop.create_task(self._beating(), name=f"treadle-memory-beat-{self.name}")

    async def _beating(self) -> None:
        """One heartbeat per worker (``liveness.beat_interval``), through the World's
        interceptor (``queue.beat``): a stalled or dead process beats no more, and the
        queue lapses its leases once it is silent past its liveness. A consumer holding
        nothing has nothing to take over: it parks (no beats, so virtual time jumps over
        a long sleep at once) and its next claim beats first (``_claimed``)."""
        interval = liveness.beat_interval(self._liveness)
        while not self.killed:
            if not self._running:
                self._parked = True
                self._busy.clear()
                await self._busy.wait()
                continue
            await asyncio.sleep(interval)
            try:
                answer = await self._points.before("queue.beat", None)
            except Exception as exc:  # a failed beat: the next one may get through
                log.warning("consumer %s: heartbeat failed: %s", self.name, exc)
                continue
            if self.killed:
                return
            if answer == "lose":
                continue  # the beat never arrived
            self._queue.beat(self.name, self.worker, self._liveness)

    def _claimed(self) -> None:
        """Leases were taken: a parked heartbeat beats now and starts again."""
        if self._parked:
            self._parked = False
            self._queue.beat(self.name, self.worker, self._liveness)
        self._busy.set()

    def in_flight(self) -> list[Leased]:
        return list(self._running.values())

    async def close(self, *, grace_seconds: float = 30.0) -> None:
        if self.closing:
            return
        self._stop()
        if self._loop_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        running = list(self._running)
        if running:  # beating on through the grace: what runs keeps its leases
            _, pending = await asyncio.wait(running, timeout=max(grace_seconds, 0))
            for task in running:  # in start order: a set's order is not reproducible
                if task in pending:
                    task.cancel()
            if pending:
                await asyncio.wait(pending)
        if self._beat_task is not None:
            self._beat_task.cancel()
        if not self.killed:
            self._queue.forget_worker(self.name)

    def kill(self) -> None:
        """The process died: take nothing more, renew nothing, settle nothing.

        Deliveries in flight are abandoned as they are: their leases lapse once its
        heartbeat is ``liveness_seconds`` old (or after ``lease_seconds``, if sooner) and
        their messages are delivered again, counted. The
        caller cancels the process's tasks (the handlers) itself.
        """
        self.killed = True
        self._stop()
        for heartbeat in list(self._heartbeats):
            heartbeat.cancel()
        if self._beat_task is not None:
            self._beat_task.cancel()  # silent from now: its leases lapse past its liveness

    def _stop(self) -> None:
        self.closing = True
        self._queue.unlisten(self._wake)
        if self._loop_task is not None:
            self._loop_task.cancel()

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.closing:
            self._wake.clear()
            free = self._concurrency - len(self._running)
            claimed = self._queue.claim(
                self._kinds,
                free,
                self._tuning.lease_seconds,
                world=self.world,
                consumer=self.name,
                worker=self.worker,
            )
            for leased in claimed:
                task = loop.create_task(
                    self._deliver(leased), name=f"treadle-memory-delivery-{leased.message_id}"
                )
                self._running[task] = leased
                task.add_done_callback(self._finished)
            if claimed:
                self._claimed()
            timeout: float | None = None
            if len(self._running) < self._concurrency:
                due = self._queue.next_due(self._kinds)
                if due is not None:
                    timeout = max(due - clock.monotonic(), MIN_WAIT_SECONDS)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.warning("memory queue: delivery task failed: %r", task.exception())
        self._wake.set()

    async def _deliver(self, leased: Leased) -> None:
        try:
            message = queuerules.read_message(leased.payload)
            queuerules.admit(
                message_id=leased.message_id,
                key=leased.key,
                delivery_count=leased.delivery_count,
                handoffs=leased.handoffs,
                run_id=message.run_id,
            )
        except errors.MessageRefused as exc:
            log.warning("%s; dead-lettered, nothing run", exc)
            self._queue.refuse(leased, exc.reason)
            return
        handler = self._handlers[message.kind]
        current_delivery.set(leased)  # before the heartbeat: its renewals are this delivery's
        heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(leased))
        self._heartbeats[heartbeat] = None
        try:
            if await self._points.before("queue.deliver", message.run_id) == "lose":
                return  # the delivery never reached a handler: its lease lapses

            async def settle(outcome: queuerules.Outcome, covered: int) -> Settled:
                return await self._settle(leased, outcome, covered)

            await queuerules.deliver_with_reruns(
                handler,
                message,
                message_id=leased.message_id,
                delivery_count=leased.delivery_count,
                handoffs=leased.handoffs,
                key=leased.key,
                lease_lost=leased.lost,
                settle=settle,
                stopped=lambda: self.killed,
            )
        except asyncio.CancelledError:
            # Shutdown cut the delivery off: deliver it again (a killed process settles nothing).
            if not self.killed:
                self._queue.abandon(leased)
            raise
        finally:
            heartbeat.cancel()
            self._heartbeats.pop(heartbeat, None)

    async def _settle(self, leased: Leased, outcome: queuerules.Outcome, covered: int) -> Settled:
        answer = await self._points.before("queue.settle", leased.run_id)
        if self.killed:
            return Settled("stale")
        if answer == "lose":
            return Settled("done")  # the settlement never arrived: the lease lapses
        settled = self._queue.settle(leased, outcome, covered, self._tuning)
        if settled.status == "stale":
            log.warning(
                "message %s (run %s): the delivery outlived its lease; its answer %s is "
                "dropped and the message is delivered again",
                leased.message_id,
                leased.run_id,
                outcome,
            )
        elif settled.status == "dead":
            log.error(
                "message %s (run %s): %d failed deliveries; moved to the dead letters",
                leased.message_id,
                leased.run_id,
                leased.delivery_count,
            )
        if answer == "fail_after":
            raise fault_points.failed_after("queue.settle", leased.run_id)
        return settled

    async def _heartbeat(self, leased: Leased) -> None:
        lease = self._tuning.lease_seconds
        while not self.killed:
            await asyncio.sleep(lease / 3)
            try:
                answer = await self._points.before("queue.renew", leased.run_id)
            except Exception as exc:  # a failed renewal: try again at the next beat
                log.warning("message %s: lease renewal failed: %s", leased.message_id, exc)
                continue
            if self.killed:
                return
            if answer == "lose":
                continue
            if not self._queue.renew(leased, lease):
                log.warning(
                    "message %s (run %s): delivery lost its lease (stalled past %.1f s)",
                    leased.message_id,
                    leased.run_id,
                    lease,
                )
                return
