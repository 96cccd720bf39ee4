"""Queue faults neither real World can produce on demand, for seed 000's degraded-mode
tests, in the style of tests/engine/faults.py.

``DeliveryFaultsWorld`` wraps a real World (local, or Postgres + NATS) and changes
only what its queue hands the handlers:

- ``fresh_ids=True``: every delivery, redeliveries included, gets a copy of its
  ``DeliveryMeta`` with a new ``message_id`` (``fresh-<n>``): seed 000's "World
  whose queue mints fresh IDs per delivery". The local queue and NATS both keep one
  id across redeliveries ("Why the identity is the queue messageId"), so this is
  the only way to run the mode; the message, its key, counts and lease are the
  real queue's.
- ``purged``: message ids whose deliveries are taken off the queue unrun (acked
  without calling the handler): an operator's purge, or a redrive policy's
  dead-letter, which the SDK never observes (seed 000 "Owner-message loss the SDK
  never observes"). Each is recorded in ``queue.purged_deliveries``.
- ``queue.redeliver_as = message_id``: the next orchestrator delivery is handed to
  its handler as a redelivery of ``message_id`` (that id, a delivery count of 2):
  seed 000's "Redelivery-while-alive" (a visibility lapse hands the owner's message
  to a second consumer while the owner still runs). Recorded in ``queue.impersonated``.

``ShiftedStartsWorld`` wraps a real World so every ``step_started`` it reports
(pages, the live feed, write answers) reads ``shift`` off its stored time: seed
000's "missing/unusable event timestamps", and a server clock running ahead.

Wrap either in a ``FaultyWorld`` to record what the handlers saw:
``FaultyWorld(DeliveryFaultsWorld(world, fresh_ids=True))``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from treadle.world import contract, events, messages, records

_fresh = itertools.count(1)


class DeliveryFaultsQueue:
    def __init__(self, inner: contract.Queue, *, fresh_ids: bool, purged: Iterable[str]) -> None:
        self._inner = inner
        self.fresh_ids = fresh_ids
        self.purged = set(purged)
        # (the real queue's id, the id the handler was given), one per delivery.
        self.minted: list[tuple[str, str]] = []
        self.purged_deliveries: list[messages.DeliveryMeta] = []
        self.redeliver_as: str | None = None
        self.impersonated: list[messages.DeliveryMeta] = []

    async def consume(
        self, handlers: Mapping[messages.MessageKind, contract.Handler], *, concurrency: int = 32
    ) -> contract.Consumer:
        def faulty(handler: contract.Handler) -> contract.Handler:
            async def delivered(message: Any, meta: messages.DeliveryMeta) -> Any:
                if meta.message_id in self.purged:
                    self.purged_deliveries.append(meta)
                    return messages.ACK
                if self.redeliver_as is not None and isinstance(
                    message, messages.OrchestratorMessage
                ):
                    as_id, self.redeliver_as = self.redeliver_as, None
                    meta = dataclasses.replace(
                        meta,
                        message_id=as_id,
                        delivery_count=max(meta.delivery_count, 2),
                        attempt=max(meta.attempt, 2),
                    )
                    self.impersonated.append(meta)
                elif self.fresh_ids:
                    minted = f"fresh-{next(_fresh)}"
                    self.minted.append((meta.message_id, minted))
                    meta = dataclasses.replace(meta, message_id=minted)
                return await handler(message, meta)

            return delivered

        wrapped = {kind: faulty(h) for kind, h in handlers.items()}
        return await self._inner.consume(wrapped, concurrency=concurrency)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class DeliveryFaultsWorld:
    """A real World whose queue deliveries get fresh ids and/or lose purged messages."""

    def __init__(self, inner: Any, *, fresh_ids: bool = False, purged: Iterable[str] = ()) -> None:
        self.inner = inner
        self.queue = DeliveryFaultsQueue(inner.queue, fresh_ids=fresh_ids, purged=purged)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def close(self) -> None:
        await self.inner.close()


class ShiftedStartsEvents:
    """A World's events whose ``step_started`` timestamps read ``shift`` off, everywhere
    the delivery sees them: pages, the live feed, and the answers to its own writes."""

    def __init__(self, inner: Any, shift: timedelta) -> None:
        self._inner = inner
        self.shift = shift

    def _fix(self, logged: events.LoggedEvent) -> events.LoggedEvent:
        if logged.type != "step_started":
            return logged
        return logged.model_copy(update={"created_at": logged.created_at + self.shift})

    async def list(self, run_id: str, **kw: Any) -> records.EventPage:
        page: records.EventPage = await self._inner.list(run_id, **kw)
        return dataclasses.replace(page, events=tuple(self._fix(e) for e in page.events))

    async def list_entity(self, run_id: str, correlation_id: str, **kw: Any) -> records.EventPage:
        page: records.EventPage = await self._inner.list_entity(run_id, correlation_id, **kw)
        return dataclasses.replace(page, events=tuple(self._fix(e) for e in page.events))

    def subscribe(
        self,
        run_id: str,
        after_slot: int,
        on_event: Callable[[events.LoggedEvent], None],
        on_error: Callable[[BaseException], None],
    ) -> Any:
        return self._inner.subscribe(run_id, after_slot, lambda e: on_event(self._fix(e)), on_error)

    async def create(self, run_id: str, event: events.Event, **kw: Any) -> records.EventResult:
        result: records.EventResult = await self._inner.create(run_id, event, **kw)
        return dataclasses.replace(result, event=self._fix(result.event))

    async def create_batch(
        self, run_id: str, batch: Sequence[events.Event], **kw: Any
    ) -> records.BatchResult:
        result: records.BatchResult = await self._inner.create_batch(run_id, batch, **kw)
        items = tuple(
            dataclasses.replace(i, event=self._fix(i.event)) if i.event is not None else i
            for i in result.items
        )
        return dataclasses.replace(result, items=items)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ShiftedStartsWorld:
    """A real World whose ``step_started`` events carry unusable timestamps: ``shift``
    into the past (seed 000 "missing/unusable event timestamps (lease remaining 0)") or
    the future (a server clock ahead of the deliveries': the lease's skew clamp)."""

    def __init__(self, inner: Any, shift: timedelta) -> None:
        self.inner = inner
        self.events = ShiftedStartsEvents(inner.events, shift)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def close(self) -> None:
        await self.inner.close()
