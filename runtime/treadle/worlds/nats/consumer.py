"""``NatsConsumer``: runs handlers for the messages its pullers take from JetStream.

One per ``NatsQueue.consume`` call. A delivery:

1. reads the message (payload, ``Treadle-*`` headers, JetStream's delivery
   count) and sends an in-progress ack at once, so the server's lease starts now;
2. heartbeats every third of the lease while it works: an in-progress ack to
   JetStream and, while it holds its run, a renewal of the run lease;
3. for a gated message (``routing.gated_run_id``), holds the run's lease first
   (``leases.RunLeases.take``) or is coalesced into the run's holder and acked;
4. runs the handler, re-running it while messages were coalesced into it (up to
   ``MAX_COALESCED_RERUNS``, then a handoff), and settles its answer: Ack acks,
   Redeliver and a raised exception nak with a delay, Handoff republishes the
   message with its identity and counts in headers and acks this copy.

A message whose handler raised on ``max_failed_deliveries`` deliveries, or that
is not a treadle message, goes to the dead letters (``deadletters.bury``); one
of a kind this worker does not serve is handed back to its kind's subject.

JetStream acks by stream sequence, so an old delivery's ack would settle a
newer one. A delivery therefore keeps its own lease clock: once it went a lease
(less a margin) without a heartbeat, or found its run lease taken over, it
sets its ``lease_lost`` (the handler's ``DeliveryMeta.lease_lost``: the
handler stops at once), its answer is dropped, and the message is left to
JetStream's redelivery. The clock is read
again right before each ack, with no await between the check and the ack, so
a delivery that lapsed while it settled never acks the redelivered copy. The
worker's liveness (``liveness.WorkerLiveness``) lists every delivery in its
heartbeat entry; once that liveness lapses every delivery's ``lease_lost`` reads
as set, and a message arriving meanwhile is nakked straight back. Two
more guards keep a stalled event loop from showing a handler one message
twice: a redelivery of a message this process is still working on (and
holds by its own clock) is adopted by the running delivery, and a redelivery
that crossed this process's ack is acked again and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import nats.errors
from nats.aio.msg import Msg

from treadle import errors
from treadle.world import contract, messages, queuerules
from treadle.worlds.nats import deadletters, delivery, leases, names
from treadle.worlds.nats.delivery import Delivery
from treadle.worlds.nats.pulling import Puller, Slots

if TYPE_CHECKING:
    from treadle.worlds.nats.queue import NatsQueue

log = logging.getLogger("treadle.worlds.nats")

ACK_TIMEOUT_SECONDS: Final = 5.0
_MAX_ACKED_REMEMBERED: Final = 100_000


@dataclass(frozen=True, slots=True)
class _Settled:
    """What settling a delivery's answer came to (``queuerules.Settlement``)."""

    status: str  # "rerun": messages were coalesced into the delivery; else "done"
    coalesced: int = 0


_DONE = _Settled("done")


class NatsConsumer:
    def __init__(
        self,
        owner: NatsQueue,
        handlers: dict[messages.MessageKind, contract.Handler],
        concurrency: int,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if not handlers:
            raise ValueError("consume needs at least one handler")
        self._queue = owner
        self._handlers = handlers
        self._lease = owner.tuning.lease_seconds
        # A delivery treats its lease as lapsed this much before JetStream would.
        self._margin = min(self._lease * 0.1, 1.0)
        self._slots = Slots(concurrency)
        self._pullers: list[Puller] = []
        self._running: set[asyncio.Task[None]] = set()
        # Deliveries under way, by stream sequence (JetStream's identity of a message copy).
        self._active: dict[int, Delivery] = {}
        # Recently acked stream sequences, to drop a redelivery that crossed the ack.
        self._acked: dict[int, float] = {}
        self._acked_horizon = max(10 * self._lease, 60.0)
        self._closing = False

    async def start(self, consumers: dict[messages.MessageKind, str]) -> None:
        for kind in sorted(self._handlers):
            puller = Puller(
                self._queue.nc,
                stream=self._queue.names.stream,
                consumer=consumers[kind],
                slots=self._slots,
                deliver=self._start_delivery,
            )
            self._pullers.append(puller)
            await puller.start()

    async def close(self, *, grace_seconds: float = 30.0) -> None:
        if self._closing:
            return
        self._closing = True
        for puller in self._pullers:
            await puller.stop()
        running = list(self._running)
        if running:
            _, pending = await asyncio.wait(running, timeout=max(grace_seconds, 0))
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        with contextlib.suppress(Exception):
            await self._queue.nc.flush()
        await self._queue.forget(self)

    def _start_delivery(self, msg: Msg) -> None:
        task = asyncio.get_running_loop().create_task(self._accept(msg))
        self._running.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._slots.finished()
        if not task.cancelled() and task.exception() is not None:
            log.error("nats queue: delivery task failed", exc_info=task.exception())

    def _accept(self, msg: Msg) -> Coroutine[Any, Any, None]:
        """What to do with a message JetStream just delivered to this process."""
        if self._closing:
            return _quietly(msg.nak())  # taken as the consumer closed: straight back
        live = self._queue.liveness
        if live is not None and not live.fresh():
            # This worker's liveness lapsed: it takes nothing until a beat gets through.
            # Back after a beat, not at once: every worker may be lapsed (NATS was down),
            # and an immediate nak would spin the message through them all, each time
            # counted as a delivery.
            return _quietly(msg.nak(delay=live.beat_seconds))
        try:
            d = delivery.read_delivery(
                msg, self._queue.names, max_carried=self._queue.tuning.max_failed_deliveries
            )
        except errors.MessageRefused as exc:
            log.warning("%s; dead-lettered, nothing run", exc)
            return self._bury_unreadable(msg, exc)
        except (ValueError, nats.errors.Error) as exc:
            return self._bury_unreadable(msg, exc)
        if d.sequence in self._acked:
            # A redelivery that crossed this process's ack: the message is gone already.
            return _quietly(msg.ack())
        if d.message.kind not in self._handlers:
            return self._hand_back(d)
        current = self._active.get(d.sequence)
        if current is not None and self._alive(current):
            # Redelivered while this process still works on it (its progress crossed the
            # lease's end, as after a stalled loop): the running delivery carries on under it.
            current.msg = msg
            return _quietly(self._progress(current))
        if current is not None:
            self._lapsed(current)  # the new copy is the message now; the old one stops
        if live is not None:
            d.lease_lost.expired = live.expired()
        self._active[d.sequence] = d
        return self._deliver(d)

    async def _bury_unreadable(self, msg: Msg, exc: Exception) -> None:
        """Not a treadle message, and never will be: a dead letter at once."""
        headers = msg.headers or {}
        seq = msg.metadata.sequence.stream
        with contextlib.suppress(Exception):
            await deadletters.bury(
                self._queue,
                msg,
                message_id=headers.get(names.MESSAGE_ID) or f"seq-{seq}",
                kind="unknown",
                run_id=None,
                deliveries=msg.metadata.num_delivered,
                error=f"not a treadle message on {msg.subject}: {exc}",
            )

    async def _hand_back(self, d: Delivery) -> None:
        """A message of a kind this worker does not serve (an orchestrator message on a
        step subject, say): republish it to its kind's subject, then ack this copy; it
        takes no run lease and runs no handler here."""
        message = d.message
        target = self._queue.names.subject(message.kind, message.deployment_id, message.run_id)
        log.warning(
            "run %s: message %s is a %s message on %s, which this worker does not serve; "
            "handed back to %s",
            message.run_id,
            d.message_id,
            message.kind,
            d.msg.subject,
            target,
        )
        if target == d.msg.subject:
            await _quietly(d.msg.nak(delay=self._lease))  # no consumer here can take it
            return
        headers = {
            names.MESSAGE_ID: d.message_id,
            names.DELIVERY_OFFSET: "0",
            names.NATS_MSG_ID: f"handback-{d.sequence}",
        }
        if d.key is not None:
            headers[names.KEY] = names.encode_key(d.key)
        await self._queue.js.publish(target, d.msg.data, headers=headers)
        await self._ack(d)

    async def _deliver(self, d: Delivery) -> None:
        heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(d))
        live = self._queue.liveness
        try:
            await self._progress(d)
            if live is not None:
                live.hold(d)  # listed in the next beat: released at once if this worker dies
            if d.gate_key is not None:
                if not await self._hold(d):
                    return
                if live is not None:
                    live.hold(d)  # listed again, with its run lease's token
            await self._run(d)
        except asyncio.CancelledError:
            # Shutdown cut the delivery off: leave the message to be delivered again.
            await self._abandon(d)
            raise
        finally:
            heartbeat.cancel()
            if live is not None:
                live.drop(d)
            if self._active.get(d.sequence) is d:
                del self._active[d.sequence]

    async def _hold(self, d: Delivery) -> bool:
        """Hold the run's lease (True), or be coalesced into its holder and acked (False)."""
        assert d.gate_key is not None
        while True:
            taken = await self._queue.leases.take(d.gate_key, d.message_id)
            if isinstance(taken, leases.Held):
                d.token = taken.token
                return True
            if isinstance(taken, leases.Coalesced):
                if self._alive(d):
                    await self._ack(d)
                return False
            await asyncio.sleep(min(max(taken.seconds, 0.0), self._lease / 3) + 0.005)

    async def _run(self, d: Delivery) -> None:
        """The delivery's handler calls and their coalesced re-runs (``queuerules``); an Ack
        of a gated delivery first finishes its run lease, which may ask for a re-run."""
        handler = self._handlers[d.message.kind]

        async def settle(outcome: queuerules.Outcome, covered: int) -> _Settled:
            if isinstance(outcome, messages.Ack) and d.token is not None and self._alive(d):
                assert d.gate_key is not None
                finished = await self._queue.leases.finish(d.gate_key, d.token, covered)
                if isinstance(finished, leases.Lost):
                    await self._lost(d)
                    return _DONE
                if isinstance(finished, leases.Rerun):
                    return _Settled("rerun", finished.coalesced)
                d.token = None  # released
            await self._settle(d, outcome)
            return _DONE

        await queuerules.deliver_with_reruns(
            handler,
            d.message,
            message_id=d.message_id,
            delivery_count=d.delivery_count,
            handoffs=d.handoffs,
            key=d.key,
            lease_lost=d.lease_lost,
            settle=settle,
            carried=d.carried,
            due_at_ms=_due_at_ms(d),
        )

    async def _settle(self, d: Delivery, outcome: queuerules.Outcome) -> None:
        if not self._alive(d):
            log.warning(
                "message %s: the delivery outlived its lease; its answer %s is dropped "
                "and the message is delivered again",
                d.message_id,
                outcome,
            )
            await self._let_go(d)
            return
        match outcome:
            case messages.Ack():
                await self._ack(d)
            case messages.Redeliver(seconds=seconds):
                await self._let_go(d)
                await d.msg.nak(delay=queuerules.clamp_redeliver_delay(seconds))
            case messages.Handoff():
                await self._handoff(d)
            case queuerules.Failed(error=error):
                await self._let_go(d)
                if d.attempt >= self._queue.tuning.max_failed_deliveries:
                    await self._bury(d, error)
                    return
                await d.msg.nak(delay=self._queue.tuning.backoff_seconds(d.attempt))

    async def _bury(self, d: Delivery, error: str) -> None:
        """Failed ``max_failed_deliveries`` times: to the dead letters, not retried again."""
        self._acked[d.sequence] = time.monotonic()
        await deadletters.bury(
            self._queue,
            d.msg,
            message_id=d.message_id,
            kind=d.message.kind,
            run_id=d.message.run_id,
            deliveries=d.delivery_count,
            error=error,
        )

    async def _handoff(self, d: Delivery) -> None:
        """Republish the message with its identity and counts, then ack this copy.

        Past the handoff bound (``messages.handoff_counted``, the local queue's rule too)
        the copy is nakked instead: delivered again at once, counted as an attempt.
        """
        if messages.handoff_counted(d.handoffs):
            await self._let_go(d)
            if self._alive(d):
                await d.msg.nak()
            return
        if d.token is not None:
            assert d.gate_key is not None
            if not await self._queue.leases.reserve(d.gate_key, d.token, d.message_id):
                await self._lost(d)
                return
            d.token = None
        headers = {
            names.MESSAGE_ID: d.message_id,
            names.DELIVERY_OFFSET: str(d.delivery_count),
            names.HANDOFFS: str(d.handoffs + 1),
        }
        if d.key is not None:
            headers[names.KEY] = names.encode_key(d.key)
        await self._queue.js.publish(d.msg.subject, d.msg.data, headers=headers)
        await self._ack(d)

    async def _ack(self, d: Delivery) -> None:
        if not self._alive(d):
            # Lapsed while it settled (an await since the last check): the message may be
            # another delivery's copy now, which this ack would settle, and remembering its
            # sequence as acked would drop that copy's redelivery (audit bug 11).
            log.warning("message %s: lost its lease before the ack; not acked", d.message_id)
            return
        now = time.monotonic()
        self._acked[d.sequence] = now
        while self._acked:
            sequence, at = next(iter(self._acked.items()))
            if at > now - self._acked_horizon and len(self._acked) <= _MAX_ACKED_REMEMBERED:
                break
            del self._acked[sequence]
        try:
            # No await between the lease check above and this ack.
            await d.msg.ack_sync(timeout=ACK_TIMEOUT_SECONDS)
        except Exception as exc:
            log.warning(
                "message %s: the ack was not confirmed (%s); it may be delivered again",
                d.message_id,
                exc,
            )

    async def _let_go(self, d: Delivery) -> None:
        """Release the run lease, if this delivery holds it."""
        if d.token is not None and d.gate_key is not None:
            token, d.token = d.token, None
            await self._queue.leases.release(d.gate_key, token)

    async def _lost(self, d: Delivery) -> None:
        log.warning(
            "run %s: message %s lost its run lease while it ran; delivering it again",
            d.message.run_id,
            d.message_id,
        )
        d.token = None
        if self._alive(d):
            await d.msg.nak()

    async def _abandon(self, d: Delivery) -> None:
        with contextlib.suppress(Exception):
            await self._let_go(d)
            if self._alive(d):
                await d.msg.nak()

    def _alive(self, d: Delivery) -> bool:
        """This delivery still holds its message (JetStream has not redelivered it)."""
        if d.lease_lost.is_set():
            return False
        if time.monotonic() < d.renewed_at + self._lease - self._margin:
            return True
        self._lapsed(d)
        return False

    def _lapsed(self, d: Delivery) -> None:
        """Tell the handler its lease lapsed: it stops at once, writing nothing more."""
        if not d.lease_lost.is_set():
            log.warning(
                "message %s: delivery lost its lease (stalled past %.1f s); stopping it",
                d.message_id,
                self._lease,
            )
            d.lease_lost.set()

    async def _progress(self, d: Delivery) -> None:
        """Tell JetStream the delivery is at work: its lease runs from now."""
        sent_at = time.monotonic()
        await d.msg.in_progress()
        d.renewed_at = sent_at

    async def _heartbeat(self, d: Delivery) -> None:
        while True:
            await asyncio.sleep(self._lease / 3)
            if not self._alive(d):
                return  # _alive set lease_lost: the handler stops
            try:
                await self._progress(d)
                if d.token is not None and d.gate_key is not None:
                    renewed = await self._queue.leases.renew(d.gate_key, d.token)
                    if not renewed:
                        # Another delivery holds the run now: this one is stale and stops.
                        log.warning(
                            "run %s: the run lease was taken over; stopping message %s",
                            d.message.run_id,
                            d.message_id,
                        )
                        d.lease_lost.set()
                        return
            except Exception as exc:
                log.warning("message %s: heartbeat failed: %s", d.message_id, exc)


async def _quietly(work: Awaitable[None]) -> None:
    with contextlib.suppress(Exception):
        await work


def _due_at_ms(d: Delivery) -> int | None:
    """When a first delivery's message came due: its stream time (a scheduled send is
    stored when its schedule fires). Unknown for a redelivery (a nak's delay)."""
    meta = d.msg.metadata
    if meta.num_delivered != 1:
        return None
    return int(meta.timestamp.timestamp() * 1000)
