"""The in-band writer: every decision of one orchestrator delivery goes through it.

One write at a time, in the order they were asked for, each carrying the
fence count (``expected_seq_in_band``, taken from the load's snapshot and
advanced by each accepted write's ``allocated``) and the slot its decision
was made against (``event_count``).
A fence refusal stops the writer for good: that write and every later one
raise ``Superseded`` without reaching the World. A storage or transport
error is an unknown outcome (the write may have committed): the writer
settles it in place (``_settle_unknown``, the one place of that rule) by
reading the log above the slot the write was made against, and either finds
the write committed there (and answers as the World would have) or sends it
again at the same count, which the fence refuses if anyone wrote in-band
meanwhile. Only when that fails too does the writer stop. Once the queue
said the delivery lost its lease (``DeliveryMeta.lease_lost``), every write
raises ``LeaseLost`` before it reaches the World (seed 003: a delivery that
knows it is stale writes nothing more). Any other refusal (``RunExpired``,
say) keeps the count and is the caller's to handle.

Called by ``orchestrator.delivery``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime
from typing import TypeVar

from treadle import errors
from treadle.orchestrator import reads
from treadle.world import contract, events, records

log = logging.getLogger("treadle.orchestrator.writer")

R = TypeVar("R", records.EventResult, records.BatchResult)

# Reads of the log, each followed by a fresh write when the first was not found, after
# an in-band write's unknown outcome; the first waits this long, each next one twice as
# long (0.1 + 0.2 + 0.4 s).
UNKNOWN_OUTCOME_TRIES = 3
UNKNOWN_OUTCOME_RETRY_SECONDS = 0.1


class Superseded(errors.TreadleError):
    """The fence refused this delivery's writes; it must stop and redeliver."""


class LeaseLost(Superseded):
    """The queue said this delivery's lease lapsed: it stops at once and writes nothing."""


class WriterStopped(errors.TreadleError):
    """An earlier write failed in a way that ends the delivery's writes."""


class InBandWriter:
    def __init__(
        self,
        world: contract.World,
        run_id: str,
        snapshot: events.Snapshot,
        lease_lost: asyncio.Event | None = None,
        *,
        read_timeout_ms: int = 0,
    ) -> None:
        self._world = world
        self._lease_lost = lease_lost
        self._read_timeout_ms = read_timeout_ms  # of the reads after an unknown outcome
        self.run_id = run_id
        self.expected = snapshot.seq_in_band
        # The highest slot below which this delivery holds every event.
        self.known = snapshot.seq
        self.superseded: errors.InBandSuperseded | None = None
        self.failure: BaseException | None = None
        self.accepted: list[events.LoggedEvent] = []
        # Writes go one at a time, in the order asked for: each waits for the one before.
        self._last: asyncio.Future[None] | None = None

    @property
    def stopped(self) -> bool:
        return self.superseded is not None or self.failure is not None

    def hold_through(self, slot: int) -> None:
        """The delivery now holds every event up to ``slot``."""
        self.known = max(self.known, slot)

    def _check(self) -> None:
        if self._lease_lost is not None and self._lease_lost.is_set():
            raise LeaseLost(f"run {self.run_id}: the delivery lost its lease; nothing is written")
        if self.superseded is not None:
            raise Superseded(str(self.superseded))
        if self.failure is not None:
            raise WriterStopped(f"run {self.run_id}: writes stopped after: {self.failure}")

    def _take_turn(self) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        """Reserve the next place in line, now (before any write asked for later)."""
        before, mine = self._last, asyncio.get_running_loop().create_future()
        self._last = mine
        return before, mine

    @contextlib.asynccontextmanager
    async def _turn(
        self, place: tuple[asyncio.Future[None] | None, asyncio.Future[None]]
    ) -> AsyncIterator[None]:
        before, mine = place
        try:
            if before is not None and not before.done():
                await asyncio.wait([before])
            yield
        except BaseException:
            if before is not None and not before.done():
                # Cancelled while waiting: the next in line still waits for ours' predecessor.
                before.add_done_callback(lambda _done: _finish(mine))
            else:
                _finish(mine)
            raise
        _finish(mine)

    def create_soon(
        self, event: events.Event, *, required: bool = False
    ) -> asyncio.Task[records.EventResult]:
        """Queue a write now, ahead of every write asked for later, without waiting for it.
        ``required``: any failure of it, a business refusal too, stops the writer, so no
        write queued behind it reaches the World (turbo's run_started, ``turbo``)."""
        place = self._take_turn()
        return asyncio.ensure_future(self._create(event, None, place, required=required))

    async def create(
        self, event: events.Event, *, occurred_at: datetime | None = None
    ) -> records.EventResult:
        return await self._create(event, occurred_at, self._take_turn())

    async def _create(
        self,
        event: events.Event,
        occurred_at: datetime | None,
        place: tuple[asyncio.Future[None] | None, asyncio.Future[None]],
        *,
        required: bool = False,
    ) -> records.EventResult:
        async with self._turn(place):
            self._check()
            against = self.known

            def write() -> Awaitable[records.EventResult]:
                return self._world.events.create(
                    self.run_id,
                    event,
                    in_band=True,
                    expected_seq_in_band=self.expected,
                    event_count=against,
                    occurred_at=occurred_at,
                )

            try:
                try:
                    result = await write()
                except errors.StorageUnavailable as exc:
                    found = await self._settle_unknown(exc, [event], against, write)
                    if isinstance(found, records.EventResult):
                        result = found
                    else:
                        mine, report = found
                        result = records.EventResult(mine[0], allocated=1, report=report)
            except BaseException as exc:
                try:
                    self._stop(exc)
                finally:
                    if required and not self.stopped:
                        self.failure = exc  # before the next write takes its turn
                raise
            self._accept(result.allocated, [result.event], result.has_more)
            return result

    async def create_batch(
        self,
        batch: Sequence[events.Event],
        *,
        occurred_at: datetime | None = None,
        select: Callable[[Sequence[events.Event]], Sequence[events.Event]] | None = None,
    ) -> records.BatchResult:
        """One batch write. ``occurred_at`` is stored as every event's time (run-ahead
        handed the events to the workflow at it). ``select``, called when the write's turn
        comes, picks what is still written (a run-ahead stop keeps only the outcomes of
        steps whose start committed); nothing selected is no write at all."""
        async with self._turn(self._take_turn()):
            self._check()
            if select is not None:
                batch = select(batch)
                if not batch:
                    return records.BatchResult(items=(), allocated=0)
            against = self.known

            def write() -> Awaitable[records.BatchResult]:
                return self._world.events.create_batch(
                    self.run_id,
                    batch,
                    in_band=True,
                    expected_seq_in_band=self.expected,
                    event_count=against,
                    occurred_at=occurred_at,
                )

            try:
                try:
                    result = await write()
                except errors.StorageUnavailable as exc:
                    found = await self._settle_unknown(exc, batch, against, write)
                    if isinstance(found, records.BatchResult):
                        result = found
                    else:
                        result = self._batch_found(batch, *found)
            except BaseException as exc:
                self._stop(exc)
                raise
            committed = [item.event for item in result.items if item.event is not None]
            self._accept(result.allocated, committed, result.has_more)
            return result

    async def _settle_unknown(
        self,
        exc: errors.StorageUnavailable,
        written: Sequence[events.Event],
        against: int,
        write: Callable[[], Awaitable[R]],
    ) -> R | tuple[list[events.LoggedEvent], tuple[events.LoggedEvent, ...]]:
        """What became of a write that raised a storage or transport error (its outcome
        is unknown: it may have committed), settled in place.

        The delivery reads the log above ``against`` (the slot the write was made
        against; the live feed may have brought the write already). In-band events
        there that this writer did not accept are, first, its own write if they match
        ``written`` (its events in order, a batch's refused items left out): the writer
        held the fence count, so no other in-band writer could write before it. Those
        are returned with the report (every other event below them), as the World's
        answer would have been. No in-band event there: the write did not commit, and
        it is sent again at the same count (``write``); if anyone wrote in-band since,
        the fence refuses it. Any other in-band event there: another writer moved the
        fence, so this delivery is superseded.

        Seed 003 stops the writer for good and retries the delivery from a fresh load.
        That loses an inline body's outcome: the redelivery finds a ``max_retries=0``
        step started with no outcome and fails it as exhausted though its body ran and
        returned (simulation seeds 895, 2419, 2700, 2716; and for a creation batch with
        inline starts, 216 and 232: the redelivery fails the started step unrun). The
        fence makes the retry safe, so it is made here, for every in-band write.
        ``UNKNOWN_OUTCOME_TRIES`` reads or writes that fail again, or a lost lease, stop
        the writer with the error, as before.
        """
        log.warning(
            "run %s: in-band write of %s had an unknown outcome (%s); reading the log above "
            "slot %d",
            self.run_id,
            written[0].type,
            exc,
            against,
        )
        for tries in range(1, UNKNOWN_OUTCOME_TRIES + 1):
            await asyncio.sleep(UNKNOWN_OUTCOME_RETRY_SECONDS * 2 ** (tries - 1))
            self._check()  # a delivery that lost its lease writes nothing more
            try:
                above = await self._read_above(against)
            except errors.StorageUnavailable as read_exc:
                log.warning("run %s: reading the log failed too: %s", self.run_id, read_exc)
                continue
            own = {e.slot for e in self.accepted}
            theirs = [e for e in above if e.in_band and e.slot not in own]
            if theirs:
                mine = _own_prefix(written, theirs)
                if not mine:  # another writer moved the fence: stop as its refusal would
                    raise errors.InBandSuperseded(
                        self.run_id,
                        expected_seq_in_band=self.expected,
                        seq_in_band=self.expected + len(theirs),
                    )
                log.info(
                    "run %s: the write of %s committed at slot %d before its answer was lost",
                    self.run_id,
                    written[0].type,
                    mine[0].slot,
                )
                top = mine[-1].slot
                slots = {e.slot for e in mine}
                report = tuple(e for e in above if e.slot < top and e.slot not in slots)
                return mine, report
            # The read may have taken long (a stalled World): the lease may have lapsed
            # meanwhile, and a delivery that knows it wrote nothing more (simulation seed
            # 208: a write again 5 s after the queue said the lease was gone).
            self._check()
            try:
                return await write()
            except errors.StorageUnavailable as again:
                log.warning("run %s: writing it again failed too: %s", self.run_id, again)
        raise exc

    async def _read_above(self, after: int) -> list[events.LoggedEvent]:
        found: list[events.LoggedEvent] = []
        while True:
            page = await reads.bounded(
                functools.partial(self._world.events.list, self.run_id, after_slot=after),
                timeout_ms=self._read_timeout_ms,
                run_id=self.run_id,
                what=f"the log after slot {after} (an unknown outcome)",
            )
            found.extend(page.events)
            if not page.has_more:
                return found
            after = page.cursor

    def _batch_found(
        self,
        batch: Sequence[events.Event],
        mine: list[events.LoggedEvent],
        report: tuple[events.LoggedEvent, ...],
    ) -> records.BatchResult:
        """A batch found committed: its items in order; one not in the log was refused."""
        found = iter(mine)
        logged = next(found, None)
        items = []
        for item in batch:
            if logged is not None and _same(item, logged):
                items.append(records.BatchItemResult(event=logged))
                logged = next(found, None)
            else:
                items.append(
                    records.BatchItemResult(
                        error=errors.OutcomeLost(
                            self.run_id, event_type=item.type, correlation_id=item.correlation_id
                        )
                    )
                )
        return records.BatchResult(items=tuple(items), allocated=len(mine), report=report)

    def _stop(self, exc: BaseException) -> None:
        if isinstance(exc, errors.InBandSuperseded):
            log.info("run %s: in-band write refused by the fence: %s", self.run_id, exc)
            self.superseded = exc
            raise Superseded(str(exc)) from exc
        if isinstance(exc, errors.WorldError) and not isinstance(
            exc, errors.StorageUnavailable | errors.WorldContractError
        ):
            return  # a business refusal: the count stands, the caller decides
        self.failure = exc

    def _accept(self, allocated: int, committed: list[events.LoggedEvent], has_more: bool) -> None:
        self.expected += allocated
        self.accepted.extend(committed)
        if committed and not has_more:
            self.known = max(self.known, max(e.slot for e in committed))


def _same(written: events.Event, logged: events.LoggedEvent) -> bool:
    """``logged`` is what the World stored for ``written`` (a hook clash is stored as a
    ``hook_conflict``)."""
    stored = logged.event
    kinds = {written.type, "hook_conflict"} if written.type == "hook_created" else {written.type}
    return (
        stored.type in kinds
        and stored.correlation_id == written.correlation_id
        and getattr(stored, "attempt", None) == getattr(written, "attempt", None)
    )


def _own_prefix(
    written: Sequence[events.Event], found: list[events.LoggedEvent]
) -> list[events.LoggedEvent]:
    """The leading events of ``found`` that are ``written``'s, in order (refused items of a
    batch are skipped); empty when the first one is not."""
    mine: list[events.LoggedEvent] = []
    rest = iter(written)
    for logged in found:
        if not any(_same(item, logged) for item in rest):
            break
        mine.append(logged)
    return mine


def _finish(turn: asyncio.Future[None]) -> None:
    if not turn.done():
        turn.set_result(None)
