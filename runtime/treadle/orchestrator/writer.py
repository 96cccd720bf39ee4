"""The in-band writer: every decision of one orchestrator delivery goes through it.

One write at a time, in the order they were asked for, each carrying the
fence count (``expected_seq_in_band``, taken from the load's snapshot and
advanced by each accepted write's ``allocated``) and the slot its decision
was made against (``event_count``).
A fence refusal stops the writer for good: that write and every later one
raise ``Superseded`` without reaching the World. A transport or storage
failure stops it too. Once the queue said the delivery lost its lease
(``DeliveryMeta.lease_lost``), every write raises ``LeaseLost`` before it
reaches the World (seed 003: a delivery that knows it is stale writes
nothing more). Any other refusal (``RunExpired``, say) keeps the count and is
the caller's to handle.

Called by ``orchestrator.delivery``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import datetime

from treadle import errors
from treadle.world import contract, events, records

log = logging.getLogger("treadle.orchestrator.writer")


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
    ) -> None:
        self._world = world
        self._lease_lost = lease_lost
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

    def create_soon(self, event: events.Event) -> asyncio.Task[records.EventResult]:
        """Queue a write now, ahead of every write asked for later, without waiting for it."""
        place = self._take_turn()
        return asyncio.ensure_future(self._create(event, None, place))

    async def create(
        self, event: events.Event, *, occurred_at: datetime | None = None
    ) -> records.EventResult:
        return await self._create(event, occurred_at, self._take_turn())

    async def _create(
        self,
        event: events.Event,
        occurred_at: datetime | None,
        place: tuple[asyncio.Future[None] | None, asyncio.Future[None]],
    ) -> records.EventResult:
        async with self._turn(place):
            self._check()
            try:
                result = await self._world.events.create(
                    self.run_id,
                    event,
                    in_band=True,
                    expected_seq_in_band=self.expected,
                    event_count=self.known,
                    occurred_at=occurred_at,
                )
            except BaseException as exc:
                self._stop(exc)
                raise
            self._accept(result.allocated, [result.event], result.has_more)
            return result

    async def create_batch(self, batch: Sequence[events.Event]) -> records.BatchResult:
        async with self._turn(self._take_turn()):
            self._check()
            try:
                result = await self._world.events.create_batch(
                    self.run_id,
                    batch,
                    in_band=True,
                    expected_seq_in_band=self.expected,
                    event_count=self.known,
                )
            except BaseException as exc:
                self._stop(exc)
                raise
            committed = [item.event for item in result.items if item.event is not None]
            self._accept(result.allocated, committed, result.has_more)
            return result

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


def _finish(turn: asyncio.Future[None]) -> None:
    if not turn.done():
        turn.set_result(None)
