"""Queue conformance for a delivery's lease word and the handoff bound.

Two queue rules the orchestrator leans on (audit bugs 4, 11 and F3): a queue
sets ``DeliveryMeta.lease_lost`` once it knows the delivery's lease lapsed, so
the handler stops at once, and it never settles the message for that delivery
afterwards; and past ``constants.MAX_HANDOFFS`` handoffs of one message a
``Handoff`` is an ordinary, counted delivery (``messages.handoff_counted``), so
a handler that always hands off reaches the delivery cap instead of looping.
A World's test module subclasses ``QueueLeaseConformance`` and provides a
``harness`` fixture, as for ``queue.QueueConformance``.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from treadle.world import constants, messages
from treadle.world.conformance.harness import WorldHarness
from treadle.world.conformance.queue import (
    FAST,
    WAIT_SECONDS,
    Message,
    Recorder,
    consuming,
    counts,
    message_of_kind,
    opened,
    step_message,
)


class QueueLeaseConformance:
    async def test_a_delivery_stalled_past_its_lease_is_told_and_never_settles(
        self, harness: WorldHarness
    ) -> None:
        """The queue sets lease_lost on a delivery that stalled past its lease; that
        delivery's later Ack settles nothing: the message is delivered again and acked
        by the live delivery."""
        async with opened(harness) as world:
            told: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            calls: list[messages.DeliveryMeta] = []
            again = asyncio.Event()

            async def handler(message: Message, meta: messages.DeliveryMeta) -> messages.Ack:
                calls.append(meta)
                if len(calls) > 1:
                    again.set()
                    return messages.ACK
                assert meta.lease_lost is not None
                assert not meta.lost_lease()
                time.sleep(FAST.lease_seconds * 1.6)  # noqa: ASYNC251 - the stall under test
                try:
                    async with asyncio.timeout(WAIT_SECONDS):
                        await meta.lease_lost.wait()
                    told.set_result(True)
                except TimeoutError:
                    told.set_result(False)
                return messages.ACK  # too late: must not settle the redelivered copy

            async with consuming(world, {"step": handler}):
                await world.queue.send(step_message())
                assert await asyncio.wait_for(told, WAIT_SECONDS * 2), "lease_lost never set"
                await asyncio.wait_for(again.wait(), WAIT_SECONDS)
                assert calls[1].delivery_count >= 2
                assert not calls[1].lost_lease()

    @pytest.mark.parametrize("kind", ["orchestrator", "step"])
    async def test_handoffs_past_the_bound_are_counted_deliveries(
        self, harness: WorldHarness, kind: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Past MAX_HANDOFFS (2 here) a Handoff is redelivered at once, counted."""
        monkeypatch.setattr(constants, "MAX_HANDOFFS", 2)
        async with opened(harness) as world:
            recorder = Recorder(messages.HANDOFF, messages.HANDOFF, messages.HANDOFF)
            async with consuming(world, {"orchestrator": recorder, "step": recorder}):
                sent = await world.queue.send(message_of_kind(kind))
                calls = [await recorder.next() for _ in range(4)]
                assert {c.meta.message_id for c in calls} == {sent.message_id}
                assert [counts(c) for c in calls] == [(1, 1), (2, 1), (3, 1), (4, 2)]
                await recorder.assert_quiet()
