"""The step backlog the operator scales step workers by: waiting plus in flight, per deployment."""

from __future__ import annotations

import asyncio

from treadle.world import messages
from treadle.world.conformance.queue import step_message

from .conftest import NatsHarness


async def test_pending_counts_waiting_and_in_flight_steps_of_one_deployment(
    harness: NatsHarness,
) -> None:
    queue = await harness.connect(deployment_id="blue")
    other = await harness.connect(deployment_id="green")
    release = asyncio.Event()
    started = asyncio.Event()
    all_done = asyncio.Event()
    handled: list[object] = []

    async def hold(message: object, meta: messages.DeliveryMeta) -> messages.HandlerResult:
        started.set()
        await release.wait()
        handled.append(message)
        if len(handled) == 5:
            all_done.set()
        return messages.Ack()

    try:
        assert await queue.pending("step", "blue") == 0, "no consumer yet: nothing to count"
        consumer = await queue.consume({"step": hold}, concurrency=1)
        for n in range(5):
            await queue.send(
                step_message(step_id=f"s{n}").model_copy(update={"deployment_id": "blue"})
            )
        await other.send(step_message().model_copy(update={"deployment_id": "green"}))
        await asyncio.wait_for(started.wait(), 10)
        assert await queue.pending("step", "blue") == 5  # 1 in flight + 4 waiting
        assert await queue.pending("orchestrator", "blue") == 0
        release.set()
        await asyncio.wait_for(all_done.wait(), 10)
        await consumer.close(grace_seconds=5)
        assert await queue.pending("step", "blue") == 0
    finally:
        await queue.close()
        await other.close()
