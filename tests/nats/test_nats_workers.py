"""Across worker processes: two ``NatsQueue`` connections on one stream act as two workers.

Seed 003 "Queue: one orchestrator delivery per run", across processes: the run
lease in JetStream KV keeps a run's orchestrator deliveries one at a time over
every worker, a message for a run held elsewhere is coalesced into the holder,
and a dead holder's run is taken over by its message's redelivery once its
lease expires. Messages go to the deployment they are stamped with.
"""

from __future__ import annotations

import asyncio

from treadle.world import contract, ids, messages
from treadle.world.conformance import queue as conformance
from treadle.world.conformance.queue import FAST, WAIT_SECONDS, Recorder, counts
from treadle.worlds.nats import NatsQueue

from .conftest import NatsHarness


async def _wait_for_stream_messages(worker: NatsQueue, stream: str, count: int) -> None:
    """Until the stream holds ``count`` messages (coalesced ones are acked and gone)."""
    for _ in range(int(WAIT_SECONDS / 0.05)):
        if (await worker.js.stream_info(stream)).state.messages == count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"stream {stream} never came to {count} messages")


async def test_two_workers_run_a_runs_messages_one_at_a_time_and_coalesce_across(
    harness: NatsHarness,
) -> None:
    """A run held by one worker: messages taken by either worker are folded into its re-run."""
    first, second = await harness.connect(FAST), await harness.connect(FAST)
    run_id = ids.new_run_id()
    entered, release = asyncio.Event(), asyncio.Event()
    recorder = Recorder()
    inside = max_inside = 0

    async def hold_first(message: conformance.Message, meta: messages.DeliveryMeta) -> messages.Ack:
        nonlocal inside, max_inside
        inside += 1
        max_inside = max(max_inside, inside)
        try:
            await recorder(message, meta)
            if len(recorder.calls) == 1:
                entered.set()
                await asyncio.wait_for(release.wait(), WAIT_SECONDS)
            return messages.ACK
        finally:
            inside -= 1

    consumers = [await q.consume({"orchestrator": hold_first}) for q in (first, second)]
    try:
        sent = await first.send(conformance.orchestrator_message(run_id))
        await asyncio.wait_for(entered.wait(), WAIT_SECONDS)
        # Keyed sends are published (never folded at the send): either worker takes them.
        for n in range(4):
            await second.send(conformance.orchestrator_message(run_id), key=f"wake-{n}")
        await _wait_for_stream_messages(second, harness.stream, 1)
        release.set()
        initial, rerun = await recorder.next(), await recorder.next()
        await recorder.assert_quiet()
    finally:
        release.set()
        for consumer in consumers:
            await consumer.close(grace_seconds=2)
        await first.close()
        await second.close()
    assert max_inside == 1
    assert [c.meta.message_id for c in recorder.calls] == [sent.message_id] * 2
    assert (initial.meta.delivery_count, initial.meta.attempt, initial.meta.rerun) == (1, 1, 0)
    assert (rerun.meta.delivery_count, rerun.meta.attempt, rerun.meta.rerun) == (2, 1, 1)


async def test_a_dead_workers_run_is_taken_over_by_the_redelivery_of_its_message(
    harness: NatsHarness,
) -> None:
    """A holder whose process vanished keeps its run until its lease expires, then no longer."""
    doomed, survivor = await harness.connect(FAST), await harness.connect(FAST)
    run_id = ids.new_run_id()
    held, forever = asyncio.Event(), asyncio.Event()

    async def hang(message: conformance.Message, meta: messages.DeliveryMeta) -> messages.Ack:
        held.set()
        await forever.wait()
        return messages.ACK

    stuck = await doomed.consume({"orchestrator": hang})
    recorder = Recorder()
    taking_over: contract.Consumer | None = None
    try:
        sent = await doomed.send(conformance.orchestrator_message(run_id))
        await asyncio.wait_for(held.wait(), WAIT_SECONDS)
        # Folded into the doomed holder at the send; the takeover's run covers it.
        await survivor.send(conformance.orchestrator_message(run_id))
        # The process dies: no nak, no release; its connection just goes.
        await doomed.nc.close()
        taking_over = await survivor.consume({"orchestrator": recorder})
        taken = await recorder.next()
        assert taken.meta.message_id == sent.message_id
        assert counts(taken) == (2, 2)
        await recorder.assert_quiet()
    finally:
        forever.set()
        await stuck.close(grace_seconds=2)
        if taking_over is not None:
            await taking_over.close(grace_seconds=2)
        await doomed.close()
        await survivor.close()


async def test_a_message_goes_to_the_deployment_it_is_stamped_with(harness: NatsHarness) -> None:
    """Each deployment consumes its own subjects; an unstamped message stays with its sender."""
    blue = await harness.connect(FAST, deployment_id="blue")
    green = await harness.connect(FAST, deployment_id="green")
    blue_seen, green_seen = Recorder(), Recorder()
    consumers = [
        await blue.consume({"orchestrator": blue_seen}),
        await green.consume({"orchestrator": green_seen}),
    ]
    try:
        for_green = messages.OrchestratorMessage(
            run_id=ids.new_run_id(), run_spec_version=9, deployment_id="green"
        )
        to_green = await blue.send(for_green)
        unstamped = await blue.send(conformance.orchestrator_message(ids.new_run_id()))
        assert (await green_seen.next()).meta.message_id == to_green.message_id
        assert (await blue_seen.next()).meta.message_id == unstamped.message_id
        await green_seen.assert_quiet(0.2)
        await blue_seen.assert_quiet(0.2)
    finally:
        for consumer in consumers:
            await consumer.close(grace_seconds=2)
        await blue.close()
        await green.close()


async def test_one_delivery_slot_serves_both_kinds_one_at_a_time(harness: NatsHarness) -> None:
    """``concurrency=1`` over two consumers: each kind is delivered, never two at once."""
    queue = await harness.connect(FAST)
    inside = max_inside = 0
    recorder = Recorder()

    async def one_at_a_time(
        message: conformance.Message, meta: messages.DeliveryMeta
    ) -> messages.Ack:
        nonlocal inside, max_inside
        inside += 1
        max_inside = max(max_inside, inside)
        try:
            await recorder(message, meta)
            await asyncio.sleep(0.05)
            return messages.ACK
        finally:
            inside -= 1

    handlers: dict[messages.MessageKind, contract.Handler] = {
        "orchestrator": one_at_a_time,
        "step": one_at_a_time,
    }
    consumer = await queue.consume(handlers, concurrency=1)
    try:
        sent = [await queue.send(conformance.step_message()) for _ in range(3)]
        sent += [await queue.send(conformance.orchestrator_message(ids.new_run_id()))]
        delivered = {(await recorder.next()).meta.message_id for _ in range(4)}
        assert delivered == {s.message_id for s in sent}
    finally:
        await consumer.close(grace_seconds=2)
        await queue.close()
    assert max_inside == 1
