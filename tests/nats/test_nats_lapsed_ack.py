"""Bug 11 (audit section 5): a lapsed NATS delivery can never ack its redelivered copy.

JetStream acks by stream sequence. D1 answers Handoff and stalls the event loop
inside the handoff's republish, past its lease; JetStream redelivers the message
(D2) meanwhile. D1's ack must not settle D2's copy: D2 naks it (Redeliver), and
JetStream delivers it again (D3). Before the fix D1 checked its lease before the
republish and acked after it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from treadle.world import contract, messages
from treadle.world.conformance.queue import consuming, opened, step_message
from treadle.worlds.nats import names

from .conftest import NatsHarness

LEASE = contract.QueueTuning(lease_seconds=1.0, backoff_base_seconds=0.05, backoff_max_seconds=0.2)


class StallingHandoffs:
    """The JetStream context, with the first handoff republish stalling the loop."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.stalled = False

    async def publish(self, subject: str, payload: bytes, **kw: Any) -> Any:
        headers = kw.get("headers") or {}
        if names.HANDOFFS in headers and not self.stalled:
            self.stalled = True
            time.sleep(LEASE.lease_seconds * 1.6)
        return await self._inner.publish(subject, payload, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_a_delivery_that_lapsed_in_its_handoff_never_acks_the_redelivered_copy(
    harness: NatsHarness,
) -> None:
    async with opened(harness, LEASE) as world:
        queue: Any = world.queue
        stalling = StallingHandoffs(queue.js)
        queue.js = stalling
        calls: list[tuple[int, int]] = []
        d3 = asyncio.Event()

        async def handler(message: Any, meta: messages.DeliveryMeta) -> messages.HandlerResult:
            seen = (meta.delivery_count, meta.attempt)
            calls.append(seen)
            if seen == (1, 1):
                return messages.HANDOFF  # D1: its republish stalls past the lease
            if seen == (2, 2):
                return messages.Redeliver(0.05)  # D2, the original copy redelivered
            if seen == (3, 3):
                d3.set()  # the original copy again, after D2's nak
            return messages.ACK

        async with consuming(world, {"step": handler}):
            await world.queue.send(step_message())
            try:
                await asyncio.wait_for(d3.wait(), 15)
            except TimeoutError:
                raise AssertionError(f"D1's late ack settled D2's copy; calls {calls}") from None
            assert stalling.stalled
