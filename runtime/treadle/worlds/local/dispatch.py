"""The local World's in-process dispatcher: takes due messages and runs handlers.

One ``LocalConsumer`` per ``queue.consume`` call. Its loop claims what is due
(``queue.claim``), starts a task per delivery, and sleeps until a send, a
finished delivery or the next due time wakes it. A delivery renews its lease
every third of it while the handler runs; a handler that stalls the event
loop past its lease loses it, and the message is delivered again while the
stalled one's answer is dropped (its lease is gone); the heartbeat that finds
the lease gone sets the delivery's ``DeliveryMeta.lease_lost``, so the handler
stops at once. When a delivery's ack is
refused because messages were coalesced into it, the handler runs again in
the same delivery (``delivery_count + rerun``, same ``attempt``), up to
``MAX_COALESCED_RERUNS`` times, then the message is handed off. A payload that
is not a treadle message goes to the dead letters at once; a message of a kind
this consumer does not serve is handed back (ready again, uncounted).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time

from treadle import errors
from treadle.world import contract, messages, queuerules
from treadle.worlds.local import deadletters, queue

log = logging.getLogger("treadle.worlds.local.dispatch")

EXTERNAL_SEND_POLL_SECONDS = 0.25


class LocalConsumer:
    def __init__(
        self,
        owner: queue.LocalQueue,
        handlers: dict[messages.MessageKind, contract.Handler],
        concurrency: int,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if not handlers:
            raise ValueError("consume needs at least one handler")
        self._queue = owner
        self._handlers = handlers
        self._kinds = tuple(sorted(handlers))
        self._concurrency = concurrency
        self._wake = asyncio.Event()
        self._running: dict[asyncio.Task[None], queue.Leased] = {}
        self._closing = False
        self._loop_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._queue.add_listener(self._wake)
        self._loop_task = asyncio.get_running_loop().create_task(
            self._dispatch(), name="treadle-local-dispatch"
        )

    async def close(self, *, grace_seconds: float = 30.0) -> None:
        if self._closing:
            return
        self._closing = True
        self._queue.remove_listener(self._wake)
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        running = list(self._running)
        if running:
            _, pending = await asyncio.wait(running, timeout=max(grace_seconds, 0))
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    async def _dispatch(self) -> None:
        tuning = self._queue.tuning
        while not self._closing:
            self._wake.clear()
            free = self._concurrency - len(self._running)
            try:
                claimed = await self._queue.db.call(
                    functools.partial(
                        queue.claim,
                        kinds=self._kinds,
                        capacity=free,
                        lease_seconds=tuning.lease_seconds,
                    )
                )
            except Exception:
                log.exception("local queue: claiming messages failed; retrying in 1 s")
                await asyncio.sleep(1.0)
                continue
            for leased in claimed.leased:
                task = asyncio.get_running_loop().create_task(
                    self._deliver(leased), name=f"treadle-delivery-{leased.message_id}"
                )
                self._running[task] = leased
                task.add_done_callback(self._finished)
            # Sends from other processes (the CLI beside a worker) do not wake us: look again.
            timeout = EXTERNAL_SEND_POLL_SECONDS
            if claimed.next_due is not None:
                timeout = min(max(claimed.next_due / 1e6 - time.time(), 0.0) + 0.001, timeout)
                if not claimed.leased and len(self._running) >= self._concurrency:
                    timeout = max(timeout, tuning.lease_seconds / 3)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("local queue: delivery task failed", exc_info=task.exception())
        self._wake.set()

    async def _deliver(self, leased: queue.Leased) -> None:
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
            await self._unreadable(leased, exc)
            return
        handler = self._handlers.get(message.kind)
        if handler is None:
            log.warning(
                "run %s: message %s is a %s message, which this consumer does not serve; "
                "handed back",
                message.run_id,
                leased.message_id,
                message.kind,
            )
            await self._queue.db.call(
                functools.partial(queue.hand_back, leased=leased, kind=message.kind)
            )
            return
        lease_lost = asyncio.Event()
        heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(leased, lease_lost))
        try:
            await queuerules.deliver_with_reruns(
                handler,
                message,
                message_id=leased.message_id,
                delivery_count=leased.delivery_count,
                handoffs=leased.handoffs,
                key=leased.key,
                lease_lost=lease_lost,
                settle=functools.partial(self._settle, leased),
                due_at_ms=leased.due_at_us // 1000 if leased.due_at_us is not None else None,
            )
        except asyncio.CancelledError:
            # Shutdown cut the delivery off: leave the message to be delivered again.
            await self._queue.db.call(functools.partial(queue.abandon, leased=leased))
            raise
        finally:
            heartbeat.cancel()

    async def _unreadable(self, leased: queue.Leased, exc: errors.MessageRefused) -> None:
        """A payload that is not a treadle message, or a row whose counts are out of range,
        never will be one: a dead letter at once, nothing run."""
        reason = exc.reason
        moved = await self._queue.db.call(
            functools.partial(
                deadletters.move_unreadable,
                message_id=leased.message_id,
                token=leased.token,
                payload=leased.payload,
                error=reason,
            )
        )
        if moved:
            log.error("%s; moved to the dead letters, nothing run", exc)

    async def _settle(
        self, leased: queue.Leased, outcome: queue.Outcome, covered: int
    ) -> queue.Settled:
        settled = await self._queue.db.call(
            functools.partial(
                queue.settle,
                leased=leased,
                outcome=outcome,
                covered=covered,
                tuning=self._queue.tuning,
            )
        )
        if settled.status == "stale":
            log.warning(
                "message %s: the delivery outlived its lease; its answer %s is dropped "
                "and the message is delivered again",
                leased.message_id,
                outcome,
            )
        elif settled.status == "dead":
            log.error(
                "message %s: %d failed deliveries; moved to the dead letters",
                leased.message_id,
                leased.delivery_count,
            )
        if settled.status != "rerun":
            self._wake.set()
        return settled

    async def _heartbeat(self, leased: queue.Leased, lease_lost: asyncio.Event) -> None:
        lease = self._queue.tuning.lease_seconds
        while True:
            await asyncio.sleep(lease / 3)
            held = await self._queue.db.call(
                functools.partial(
                    queue.renew,
                    message_id=leased.message_id,
                    token=leased.token,
                    lease_seconds=lease,
                )
            )
            if not held:
                log.warning(
                    "message %s: delivery lost its lease (stalled past %.1f s); stopping it",
                    leased.message_id,
                    lease,
                )
                lease_lost.set()
                return
