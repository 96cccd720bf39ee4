"""A fault-injecting World for the edge-case tests (EDGE-CASES.md names it for A2).

It wraps a real World (local, or Postgres + NATS) and forwards everything,
except where a test arms a fault: refuse in-band writes with
``InBandSuperseded``, fail writes with ``StorageUnavailable`` (a non-fence
error), commit a write and then raise (``fail_after_writes``: an unknown
outcome), or fail queue sends with a ``ConnectionError``, for the next ``times``
calls that match. It records every send, every delivery's start and every
handler answer, so a test can count timers and assert Redeliver / Handoff; a
test can hold a delivery at its start (``hold_deliveries``) or a send
(``hold_sends``) until an ``asyncio.Event`` is set, refuse single items of a
batch (``refuse_items``), and count log reads and feed pushes
(``FaultyEvents.reads`` / ``events_read`` / ``pushed``); ``until()`` lets a test wait on what it
recorded, and ``until_coalesced()`` on the queue's own count of messages folded
into a held delivery, instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from treadle import errors
from treadle.world import contract, events, messages, records


@dataclass
class Fault:
    matches: Callable[..., bool]
    times: int

    def hit(self, *args: Any) -> bool:
        if self.times != 0 and self.matches(*args):
            self.times -= 1
            return True
        return False


class Signal:
    """Set whenever something a test may wait on was recorded; ``until`` waits on it."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def ping(self) -> None:
        self._event.set()

    async def until(self, predicate: Callable[[], bool], timeout: float = 20.0) -> None:
        """Return once ``predicate()`` holds, re-checked on every recording; fail at timeout."""
        async with asyncio.timeout(timeout):
            while not predicate():
                self._event.clear()
                # A recording, or a tenth of a second: a predicate may read the World too.
                try:
                    async with asyncio.timeout(0.1):
                        await self._event.wait()
                except TimeoutError:
                    pass


@dataclass
class Started:
    kind: str
    message: Any
    meta: messages.DeliveryMeta


# The delivery whose handler is running (set by the spy; inline tasks inherit it).
CURRENT: contextvars.ContextVar[Started | None] = contextvars.ContextVar("current", default=None)
_order = itertools.count(1)


@dataclass
class Traced:
    """One send or committed write, in the order the World saw them, and who made it."""

    seq: int
    what: str  # "send" or "write"
    name: str  # the send's key (or message kind) / the event's type
    correlation_id: str | None
    by: Started | None
    send: messages.Send | None = None


@dataclass
class Answer:
    kind: str
    meta: messages.DeliveryMeta
    result: messages.HandlerResult | None
    error: BaseException | None


class FaultyEvents:
    def __init__(self, inner: contract.Events, trace: list[Traced] | None = None) -> None:
        self._inner = inner
        self.refusals: list[Fault] = []
        self.failures: list[Fault] = []
        self.failures_after: list[Fault] = []
        self.feed_drops: list[Fault] = []
        self.item_refusals: list[Fault] = []
        self.reads_after_failure = 0
        self.entity_reads_to_fail = 0
        self.entity_reads_failed = 0
        self.trace: list[Traced] = [] if trace is None else trace
        # Every write that reached this wrapper: (first event's type, the keyword arguments).
        self.calls: list[tuple[str, dict[str, Any]]] = []
        # Every log read (``list``): (monotonic time, the delivery that read); every event
        # the live feed pushed: (the event, the delivery subscribed).
        self.reads: list[tuple[float, Started | None]] = []
        self.pushed: list[tuple[events.LoggedEvent, Started | None]] = []
        # Per log read (``list`` or ``list_entity``): how many events it returned, and who read.
        self.events_read: list[tuple[int, Started | None]] = []
        # ``hold_writes``: (matches, stall, release), and what the World answered a held write.
        self.write_holds: list[
            tuple[Callable[[events.Event], bool], Callable[[], None], asyncio.Event]
        ] = []
        self.held_answers: list[tuple[events.Event, BaseException | None]] = []

    def _traced(self, logged: Sequence[events.LoggedEvent]) -> None:
        by = CURRENT.get()
        for e in logged:
            self.trace.append(Traced(next(_order), "write", e.type, e.correlation_id, by))

    def fail_writes(self, times: int = 1, when: Callable[..., bool] = lambda e: True) -> None:
        """Fail the next ``times`` writes whose (first) event matches with StorageUnavailable
        (a non-fence error: the World committed nothing)."""
        self.failures.append(Fault(when, times))

    def fail_after_writes(
        self, times: int = 1, when: Callable[..., bool] = lambda e: True, *, then_reads: int = 0
    ) -> None:
        """Commit the next ``times`` writes whose (first) event matches, then raise
        StorageUnavailable: an unknown outcome (seed 003), the write is in the log. With
        ``then_reads``, the next that many entity reads (``list_entity``) after each such
        write fail too (the storage is still down when the writer looks)."""
        self.failures_after.append(Fault(when, times))
        self.reads_after_failure = then_reads

    def _failed_after(self, event: events.Event) -> None:
        if any(f.hit(event) for f in self.failures_after):
            self.entity_reads_to_fail += self.reads_after_failure
            raise errors.StorageUnavailable(
                f"injected: the write of {event.type} committed, then its answer was lost"
            )

    def refuse_items(self, times: int = 1, when: Callable[..., bool] = lambda e: True) -> None:
        """In the next batches, refuse the next ``times`` items that match as the World
        refuses one item of a batch (its ``BatchItemResult.error``; nothing written for it):
        the batch's other items are written, in order, as one batch."""
        self.item_refusals.append(Fault(when, times))

    def refuse_in_band(self, times: int = 1, when: Callable[..., bool] = lambda e: True) -> None:
        """Refuse the next ``times`` in-band writes whose (first) event matches; -1 = always."""
        self.refusals.append(Fault(when, times))

    def _refused(
        self, run_id: str, event: events.Event, in_band: bool, expected: int | None
    ) -> None:
        self.calls.append((event.type, {"in_band": in_band, "expected": expected}))
        if in_band and any(f.hit(event) for f in self.refusals):
            raise errors.InBandSuperseded(
                run_id, expected_seq_in_band=expected or 0, seq_in_band=(expected or 0) + 1
            )
        if any(f.hit(event) for f in self.failures):
            raise errors.StorageUnavailable(f"injected: the write of {event.type} failed")

    def hold_writes(
        self,
        when: Callable[[events.Event], bool],
        release: asyncio.Event,
        stall: Callable[[], None] = lambda: None,
    ) -> None:
        """A write of a matching event (``create``) first calls ``stall`` (a blocking stall
        of the writer's process: ``time.sleep`` past its lease), then waits for
        ``release``, then goes to the World: a writer stuck between its last read and its
        write. What the World answered it is recorded in ``held_answers``."""
        self.write_holds.append((when, stall, release))

    async def create(self, run_id: str, event: events.Event, **kw: Any) -> records.EventResult:
        self._refused(run_id, event, kw.get("in_band", False), kw.get("expected_seq_in_band"))
        self.calls[-1][1].update(kw)
        held = next((h for h in self.write_holds if h[0](event)), None)
        if held is not None:
            self.write_holds.remove(held)
            held[1]()
            await held[2].wait()
            try:
                result = await self._inner.create(run_id, event, **kw)
            except Exception as exc:
                self.held_answers.append((event, exc))
                raise
            self.held_answers.append((event, None))
            self._traced([result.event])
            return result
        result = await self._inner.create(run_id, event, **kw)
        self._traced([result.event])
        self._failed_after(event)
        return result

    def drop_feed_after(self, times: int = 1, when: Callable[..., bool] = lambda e: True) -> None:
        """The next ``times`` live feeds of an orchestrator delivery that push an event
        matching ``when`` push it, then drop at once (``on_error``): the event was
        delivered, the feed is gone. Other feeds (a client's ``result()``) are untouched."""
        self.feed_drops.append(Fault(when, times))

    def subscribe(
        self,
        run_id: str,
        after_slot: int,
        on_event: Callable[[events.LoggedEvent], None],
        on_error: Callable[[BaseException], None],
    ) -> Any:
        """Records every push (``pushed``: the event, the delivery subscribed); drops
        an orchestrator delivery's feed where ``drop_feed_after`` asks."""
        current = CURRENT.get()
        droppable = current is not None and current.kind == "orchestrator"
        dropped = False

        def pushed(logged: events.LoggedEvent) -> None:
            nonlocal dropped
            if dropped:
                return
            self.pushed.append((logged, current))
            on_event(logged)
            if droppable and any(f.hit(logged.event) for f in self.feed_drops):
                dropped = True
                on_error(ConnectionError(f"injected: the feed dropped after {logged.type}"))

        def failed(exc: BaseException) -> None:
            if not dropped:
                on_error(exc)

        return self._inner.subscribe(run_id, after_slot, pushed, failed)

    async def create_batch(
        self, run_id: str, batch: Sequence[events.Event], **kw: Any
    ) -> records.BatchResult:
        self._refused(run_id, batch[0], kw.get("in_band", False), kw.get("expected_seq_in_band"))
        self.calls[-1][1].update(kw)
        refused = [any(f.hit(e) for f in self.item_refusals) for e in batch]
        if any(refused):
            return await self._batch_refusing(run_id, batch, refused, kw)
        result = await self._inner.create_batch(run_id, batch, **kw)
        self._traced([i.event for i in result.items if i.event is not None])
        self._failed_after(batch[0])
        return result

    async def _batch_refusing(
        self,
        run_id: str,
        batch: Sequence[events.Event],
        refused: list[bool],
        kw: dict[str, Any],
    ) -> records.BatchResult:
        kept = [e for e, no in zip(batch, refused, strict=True) if not no]
        inner = await self._inner.create_batch(run_id, kept, **kw) if kept else None
        written = iter(inner.items if inner is not None else ())
        items = tuple(
            records.BatchItemResult(
                error=errors.WorldContractError(f"injected: the batch item {e.type} was refused")
            )
            if no
            else next(written)
            for e, no in zip(batch, refused, strict=True)
        )
        self._traced([i.event for i in items if i.event is not None])
        if inner is None:
            return records.BatchResult(items=items, allocated=0)
        return records.BatchResult(
            items=items, allocated=inner.allocated, report=inner.report, has_more=inner.has_more
        )

    async def list(self, run_id: str, **kw: Any) -> Any:
        self.reads.append((time.monotonic(), CURRENT.get()))
        page = await self._inner.list(run_id, **kw)
        self.events_read.append((len(page.events), CURRENT.get()))
        return page

    async def list_entity(self, run_id: str, correlation_id: str, **kw: Any) -> Any:
        self.reads.append((time.monotonic(), CURRENT.get()))
        if self.entity_reads_to_fail > 0:
            self.entity_reads_to_fail -= 1
            self.entity_reads_failed += 1
            raise errors.StorageUnavailable(f"injected: reading {correlation_id}'s events failed")
        page = await self._inner.list_entity(run_id, correlation_id, **kw)
        self.events_read.append((len(page.events), CURRENT.get()))
        return page

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class FaultyQueue:
    def __init__(self, inner: contract.Queue, trace: list[Traced] | None = None) -> None:
        self._inner = inner
        self.trace: list[Traced] = [] if trace is None else trace
        self.send_faults: list[Fault] = []
        self.sent: list[messages.Send] = []
        self.answers: list[Answer] = []
        self.started: list[Started] = []
        self.holds: list[tuple[Callable[[Started], bool], asyncio.Event]] = []
        self.answer_faults: list[Fault] = []
        self.skews: list[tuple[Callable[[messages.Send], bool], float]] = []
        self.drops: list[Fault] = []
        self.dropped: list[messages.Send] = []
        # Sends the inner queue raised on (say its connection was lost): traced, unknown.
        self.unsent: list[messages.Send] = []
        self.send_holds: list[tuple[Callable[[messages.Send], bool], asyncio.Event]] = []
        self.held_sends: list[messages.Send] = []
        self.signal = Signal()

    def lose_answers(
        self, times: int = 1, when: Callable[[Started], bool] = lambda s: True
    ) -> None:
        """The next ``times`` matching deliveries run, then their answer is lost: the handler
        raises ConnectionError instead (a process dying after its last write or send)."""
        self.answer_faults.append(Fault(when, times))

    def skew_sends(self, seconds: float, when: Callable[[messages.Send], bool]) -> None:
        """Matching sends go out ``seconds`` sooner than asked (a clock skew, a clamped
        delay): a wait's final timer then arrives before its wait is due."""
        self.skews.append((when, seconds))

    def hold_sends(self, when: Callable[[messages.Send], bool], release: asyncio.Event) -> None:
        """A send batch holding a matching send waits until ``release`` is set (a slow
        queue call), recorded in ``held_sends``; armed send faults apply after the hold."""
        self.send_holds.append((when, release))

    def hold_deliveries(self, when: Callable[[Started], bool], release: asyncio.Event) -> None:
        """Every delivery that matches waits at its start until ``release`` is set."""
        self.holds.append((when, release))

    async def until(self, predicate: Callable[[], bool], timeout: float = 20.0) -> None:
        await self.signal.until(predicate, timeout)

    def fail_sends(self, times: int = 1, when: Callable[..., bool] = lambda s: True) -> None:
        self.send_faults.append(Fault(when, times))

    def drop_sends(self, times: int = 1, when: Callable[..., bool] = lambda s: True) -> None:
        """The next ``times`` matching sends report success but never reach the queue (a
        process that died between its commit and the send, seen from the queue)."""
        self.drops.append(Fault(when, times))

    async def send(
        self, message: Any, *, key: str | None = None, delay_seconds: float = 0.0
    ) -> Any:
        (result,) = await self.send_batch([messages.Send(message, key, delay_seconds)])
        return result

    async def send_batch(self, sends: Sequence[messages.Send]) -> list[messages.SendResult]:
        for when, release in self.send_holds:
            held = [s for s in sends if when(s)]
            if held:
                self.held_sends.extend(held)
                self.signal.ping()
                await release.wait()
        for when, seconds in self.skews:
            sends = [
                messages.Send(s.message, s.key, max(s.delay_seconds - seconds, 0.0))
                if when(s)
                else s
                for s in sends
            ]
        for send in sends:
            if any(f.hit(send) for f in self.send_faults):
                raise ConnectionError(f"injected: send of {send.key or send.message.kind} failed")
        kept = [s for s in sends if not any(f.hit(s) for f in self.drops)]
        self.dropped.extend(s for s in sends if s not in kept)
        self.sent.extend(kept)
        by = CURRENT.get()
        for send in sends:
            cid = getattr(send.message, "step_id", None)
            cont = getattr(send.message, "wait_continuation", None)
            if cont is not None:
                cid = cont.correlation_id
            name = send.key or send.message.kind
            if send in kept:
                self.trace.append(Traced(next(_order), "send", name, cid, by, send))
        self.signal.ping()
        try:
            results = iter(await self._inner.send_batch(kept) if kept else [])
        except BaseException:
            self.unsent.extend(kept)  # the World's queue raised: an unknown outcome
            raise
        return [
            next(results) if s in kept else messages.SendResult(f"dropped-{i}")
            for i, s in enumerate(sends)
        ]

    async def consume(
        self, handlers: Mapping[messages.MessageKind, contract.Handler], *, concurrency: int = 32
    ) -> contract.Consumer:
        def spy(kind: str, handler: contract.Handler) -> contract.Handler:
            async def recorded(message: Any, meta: messages.DeliveryMeta) -> Any:
                started = Started(kind, message, meta)
                CURRENT.set(started)
                self.started.append(started)
                self.signal.ping()
                for when, release in self.holds:
                    if when(started):
                        await release.wait()
                try:
                    result = await handler(message, meta)
                except Exception as exc:
                    self.answers.append(Answer(kind, meta, None, exc))
                    self.signal.ping()
                    raise
                if any(f.hit(started) for f in self.answer_faults):
                    exc = ConnectionError(f"injected: the answer {result!r} was lost")
                    self.answers.append(Answer(kind, meta, None, exc))
                    self.signal.ping()
                    raise exc
                self.answers.append(Answer(kind, meta, result, None))
                self.signal.ping()
                return result

            return recorded

        wrapped = {kind: spy(kind, h) for kind, h in handlers.items()}
        return await self._inner.consume(wrapped, concurrency=concurrency)

    def orchestrator_answers(self) -> list[Answer]:
        return [a for a in self.answers if a.kind == "orchestrator"]

    def timers(self, wait_id: str | None = None) -> list[messages.Send]:
        """The timer sends recorded (orchestrator messages with a wait continuation)."""
        return [
            s
            for s in self.sent
            if isinstance(s.message, messages.OrchestratorMessage)
            and s.message.wait_continuation is not None
            and (wait_id is None or s.message.wait_continuation.correlation_id == wait_id)
        ]


@dataclass
class FaultyWorld:
    inner: Any
    capabilities: contract.Capabilities = field(init=False)

    def __post_init__(self) -> None:
        self.capabilities = self.inner.capabilities
        self.trace: list[Traced] = []
        self.events = FaultyEvents(self.inner.events, self.trace)
        self.queue = FaultyQueue(self.inner.queue, self.trace)
        self.runs = self.inner.runs
        self.steps = self.inner.steps
        self.hooks = self.inner.hooks
        self.deployments = self.inner.deployments
        self.changes = self.inner.changes
        if hasattr(self.inner, "streams"):  # issue 17 item 6
            self.streams = self.inner.streams
        if hasattr(self.inner, "heartbeats"):  # step heartbeats (issue 17 item 5)
            self.heartbeats = self.inner.heartbeats

    async def close(self) -> None:
        await self.inner.close()


async def coalesced_into(world: FaultyWorld, run_id: str) -> int:
    """How many messages the queue has folded into the run's in-flight orchestrator
    delivery so far (0 when none holds the run): a read of the queue's own count, so a
    test can wait until a message was coalesced instead of sleeping for it. Local: the
    held row's ``coalesced``; NATS: the run lease's ``coalesced`` in its KV bucket."""
    queue = world.inner.queue
    db = getattr(queue, "db", None)
    if db is not None:

        def read(conn: Any) -> int:
            row = conn.execute(
                "SELECT COALESCE(SUM(coalesced), 0) FROM queue_messages "
                "WHERE gate_run_id = ? AND state = 'leased'",
                (run_id,),
            ).fetchone()
            return int(row[0])

        return int(await db.call(read))
    lease, _ = await queue.leases._read(queue.names.lease_key(run_id))
    return 0 if lease is None else int(lease.coalesced)


async def run_held(world: FaultyWorld, run_id: str) -> bool:
    """Whether a delivery holds the run in the queue's own store: a message answered by
    its handler still holds it until the consumer settles it (local: its row stays
    ``leased``; NATS: the run lease stays live until released or deleted)."""
    queue = world.inner.queue
    db = getattr(queue, "db", None)
    if db is not None:

        def read(conn: Any) -> int:
            row = conn.execute(
                "SELECT COUNT(*) FROM queue_messages WHERE gate_run_id = ? AND state = 'leased'",
                (run_id,),
            ).fetchone()
            return int(row[0])

        return bool(await db.call(read))
    lease, _ = await queue.leases._read(queue.names.lease_key(run_id))
    return lease is not None and lease.expires_at_ms > time.time() * 1000


async def until_released(world: FaultyWorld, run_id: str) -> None:
    """Wait (polling the queue's store every 50 ms, 20 s at most) until no delivery holds
    the run, so a message sent next has a delivery of its own instead of coalescing."""
    async with asyncio.timeout(20):
        # The lease lives in the queue's own store, which signals no one: read it.
        while await run_held(world, run_id):  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def until_coalesced(world: FaultyWorld, run_id: str, count: int = 1) -> None:
    """Wait (polling the queue's count every 50 ms, 20 s at most) until ``count``
    messages were folded into the run's in-flight delivery."""
    async with asyncio.timeout(20):
        # The count lives in the queue's own store, which signals no one: read it.
        while await coalesced_into(world, run_id) < count:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
