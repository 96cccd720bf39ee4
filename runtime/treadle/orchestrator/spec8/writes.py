"""A spec 8 delivery's writes and sends: out-of-band, unfenced, consumed in slot order.

Spec 8 runs have several writers at once (seed 003 "Spec 8 and spec 9 side by side":
"the World's step and wait rows refuse duplicates"). ``Spec8Writes`` writes each
event with ``in_band=False``, hands the committed event to the delivery's
``RunSession`` (which feeds the replay only gap-free, so another delivery's events
in between are read first), and stops writing once the queue says the delivery lost
its lease. Sends are deduplicated within the delivery by key (a key already sent by
this delivery is not sent again; the queue dedupes across deliveries).

Used by ``spec8.delivery`` and ``spec8.bodies``; ``hookwrites.write_hooks`` writes a
suspension's hooks through it.
"""

from __future__ import annotations

from collections.abc import Sequence

from treadle import errors
from treadle.orchestrator import session as sessions
from treadle.orchestrator.session import RunSession
from treadle.orchestrator.writer import LeaseLost
from treadle.world import events, messages


class Spec8Writes:
    def __init__(self, session: RunSession, meta: messages.DeliveryMeta) -> None:
        self.session = session
        self.meta = meta
        self.run_id = session.run_id
        self._world = session.rt.world
        self._sent: set[str] = set()

    def check_lease(self) -> None:
        if self.meta.lost_lease():
            raise LeaseLost(f"run {self.run_id}: the delivery lost its lease; nothing is written")

    async def write(self, event: events.Event) -> events.LoggedEvent:
        """One out-of-band write; the committed event is consumed behind what precedes it."""
        self.check_lease()
        result = await self._world.events.create(self.run_id, event, in_band=False)
        await self._absorb([result.event])
        return result.event

    async def write_batch(
        self, batch: Sequence[events.Event]
    ) -> tuple[list[events.LoggedEvent], list[errors.WorldError]]:
        """Step and wait creations in one call; per item the event or its refusal."""
        self.check_lease()
        result = await self._world.events.create_batch(self.run_id, list(batch), in_band=False)
        committed = [item.event for item in result.items if item.event is not None]
        await self._absorb(committed)
        return committed, [item.error for item in result.items if item.error is not None]

    async def _absorb(self, committed: list[events.LoggedEvent]) -> None:
        self.session.offer(committed)
        if self.session.has_pending:
            await self.session.read_tail()  # another writer's events lie in between

    async def send(self, sends: Sequence[messages.Send]) -> None:
        todo = [s for s in sends if s.key is None or s.key not in self._sent]
        if not todo:
            return
        self.check_lease()
        # A moved run's keys are scoped apart from its old deployment's (treadle.moves).
        await self._world.queue.send_batch(sessions._scoped(todo, self.session.state.repinned_slot))
        self._sent.update(s.key for s in todo if s.key is not None)
