"""Queue gating conformance: one orchestrator delivery per run, coalescing, handoff order.

Pins the per-run half of the queue contract (``contract.Queue``; seed 003 "Queue:
one orchestrator delivery per run", "Coalescing and re-runs", "Attempt
accounting", "Handoffs"): a spec 9 run's orchestrator messages are delivered one
at a time, a message due while its run is held is coalesced into the holder as a
re-run (at most ``MAX_COALESCED_RERUNS``, then a handoff), and a handed-off
message is first in its run's line. Step messages, intermediate timer hops and
spec 8 messages are never held. Tests skip what the World's capabilities do not
declare. Helpers come from ``queue``.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from treadle.world import constants, contract, ids, messages
from treadle.world.conformance import queue
from treadle.world.conformance.harness import WorldHarness


def require(
    world: contract.World, *, serializes_runs: bool = False, coalesces: bool = False
) -> None:
    """Skip a test of a gating behaviour the World does not declare."""
    if serializes_runs and not world.capabilities.serializes_runs:
        pytest.skip("the World does not serialize a run's orchestrator deliveries")
    if coalesces and not world.capabilities.coalesces:
        pytest.skip("the World does not coalesce")


class Rendezvous:
    """Handlers meet here: ``all_in`` is set once ``parties`` of them are inside at once."""

    def __init__(self, parties: int) -> None:
        self._parties = parties
        self._inside = 0
        self.all_in = asyncio.Event()

    async def meet(self) -> None:
        self._inside += 1
        try:
            if self._inside >= self._parties:
                self.all_in.set()
            await asyncio.wait_for(self.all_in.wait(), queue.WAIT_SECONDS)
        finally:
            self._inside -= 1


def is_holder_message(message: queue.Message) -> bool:
    """A spec 9 orchestrator message that joins its run's line (not a hop, not spec 8)."""
    return (
        isinstance(message, messages.OrchestratorMessage)
        and message.spec_version == constants.SPEC_VERSION_SINGLE_ORCHESTRATOR
        and not message.is_intermediate_hop
    )


class QueueGatingConformance:
    """The per-run gate, coalescing and handoff order; subclass it as ``Test...``."""

    async def test_a_runs_orchestrator_deliveries_never_overlap(
        self, harness: WorldHarness
    ) -> None:
        """Two orchestrator deliveries of one spec 9 run never run at once."""
        run_id, other_run = ids.new_run_id(), ids.new_run_id()
        entered, release, other_done = asyncio.Event(), asyncio.Event(), asyncio.Event()
        inside = max_inside = 0
        recorder = queue.Recorder()

        async def handle(message: queue.Message, meta: messages.DeliveryMeta) -> messages.Ack:
            nonlocal inside, max_inside
            if message.run_id == other_run:
                other_done.set()
                return messages.ACK
            inside += 1
            max_inside = max(max_inside, inside)
            try:
                await recorder(message, meta)
                entered.set()
                await asyncio.wait_for(release.wait(), queue.WAIT_SECONDS)
                return messages.ACK
            finally:
                inside -= 1

        async with queue.opened(harness) as world:
            require(world, serializes_runs=True)
            try:
                async with queue.consuming(world, {"orchestrator": handle}):
                    await world.queue.send(queue.orchestrator_message(run_id))
                    await recorder.next()
                    await asyncio.wait_for(entered.wait(), queue.WAIT_SECONDS)
                    for _ in range(3):
                        await world.queue.send(queue.orchestrator_message(run_id))
                    await world.queue.send(queue.orchestrator_message(other_run))
                    await asyncio.wait_for(other_done.wait(), queue.WAIT_SECONDS)
                    await asyncio.sleep(queue.QUIET_SECONDS)
                    assert max_inside == 1
                    release.set()
                    # The held messages follow: as re-runs of the holder, or one at a time.
                    await recorder.next()
                    await recorder.drain()
            finally:
                release.set()
            assert max_inside == 1

    async def test_different_runs_are_delivered_concurrently(self, harness: WorldHarness) -> None:
        """Orchestrator deliveries of two different runs run at the same time."""
        rendezvous = Rendezvous(2)

        async def meet(message: queue.Message, meta: messages.DeliveryMeta) -> messages.Ack:
            await rendezvous.meet()
            return messages.ACK

        async with queue.opened(harness) as world, queue.consuming(world, {"orchestrator": meet}):
            await world.queue.send(queue.orchestrator_message(ids.new_run_id()))
            await world.queue.send(queue.orchestrator_message(ids.new_run_id()))
            await asyncio.wait_for(rendezvous.all_in.wait(), queue.WAIT_SECONDS)

    async def test_step_messages_run_beside_their_runs_orchestrator_delivery(
        self, harness: WorldHarness
    ) -> None:
        """A run's step messages are never held behind its orchestrator delivery or each other."""
        rendezvous = Rendezvous(3)

        async def meet(message: queue.Message, meta: messages.DeliveryMeta) -> messages.Ack:
            await rendezvous.meet()
            return messages.ACK

        run_id = ids.new_run_id()
        async with queue.opened(harness) as world:
            handlers: dict[messages.MessageKind, contract.Handler] = {
                "orchestrator": meet,
                "step": meet,
            }
            async with queue.consuming(world, handlers):
                await world.queue.send(queue.orchestrator_message(run_id))
                await world.queue.send(queue.step_message(run_id, step_id="s1"))
                await world.queue.send(queue.step_message(run_id, step_id="s2"))
                await asyncio.wait_for(rendezvous.all_in.wait(), queue.WAIT_SECONDS)

    async def test_messages_for_a_held_run_are_coalesced_into_a_rerun(
        self, harness: WorldHarness
    ) -> None:
        """Messages due while a run is held re-run the holder's delivery and are never delivered."""
        run_id = ids.new_run_id()
        entered, release = asyncio.Event(), asyncio.Event()
        recorder = queue.Recorder()

        async def hold_first(message: queue.Message, meta: messages.DeliveryMeta) -> messages.Ack:
            await recorder(message, meta)
            if len(recorder.calls) == 1:
                entered.set()
                await asyncio.wait_for(release.wait(), queue.WAIT_SECONDS)
            return messages.ACK

        async with queue.opened(harness) as world:
            require(world, serializes_runs=True, coalesces=True)
            try:
                async with queue.consuming(world, {"orchestrator": hold_first}):
                    sent = await world.queue.send(queue.orchestrator_message(run_id))
                    first = await recorder.next()
                    await asyncio.wait_for(entered.wait(), queue.WAIT_SECONDS)
                    coalesced = [
                        (await world.queue.send(queue.orchestrator_message(run_id))).message_id
                        for _ in range(3)
                    ]
                    release.set()
                    rerun = await recorder.next()
                    await recorder.assert_quiet()
            finally:
                release.set()
        assert first.meta.message_id == rerun.meta.message_id == sent.message_id
        assert (first.meta.delivery_count, first.meta.attempt, first.meta.rerun) == (1, 1, 0)
        assert (rerun.meta.delivery_count, rerun.meta.attempt, rerun.meta.rerun) == (2, 1, 1)
        assert rerun.meta.invocation_started_at == first.meta.invocation_started_at
        assert len(recorder.calls) == 2
        assert not {c.meta.message_id for c in recorder.calls} & set(coalesced)

    @pytest.mark.parametrize("kind", ["intermediate_hop", "spec_8"])
    async def test_hops_and_spec_8_messages_are_never_held_or_coalesced(
        self, harness: WorldHarness, kind: str
    ) -> None:
        """An intermediate timer hop or a spec 8 message runs beside its run's holder, alone."""
        run_id = ids.new_run_id()
        entered, release, other_seen = asyncio.Event(), asyncio.Event(), asyncio.Event()
        holder = queue.Recorder()
        others = queue.Recorder()

        async def handle(message: queue.Message, meta: messages.DeliveryMeta) -> messages.Ack:
            if not is_holder_message(message):
                await others(message, meta)
                other_seen.set()
                return messages.ACK
            await holder(message, meta)
            entered.set()
            await asyncio.wait_for(release.wait(), queue.WAIT_SECONDS)
            return messages.ACK

        if kind == "intermediate_hop":
            now_ms = int(time.time() * 1000)
            hop = messages.WaitContinuation(
                correlation_id="wait_1", hop_at_ms=now_ms, resume_at_ms=now_ms + 3_600_000
            )
            unheld = queue.orchestrator_message(run_id, wait_continuation=hop)
        else:
            unheld = queue.orchestrator_message(run_id, spec_version=constants.SPEC_VERSION_LEGACY)
        async with queue.opened(harness) as world:
            require(world, serializes_runs=True)
            try:
                async with queue.consuming(world, {"orchestrator": handle}):
                    await world.queue.send(queue.orchestrator_message(run_id))
                    await asyncio.wait_for(entered.wait(), queue.WAIT_SECONDS)
                    sent = await world.queue.send(unheld)
                    # Delivered while the holder still waits for release.
                    await asyncio.wait_for(other_seen.wait(), queue.WAIT_SECONDS)
                    release.set()
                    await holder.next()
                    await holder.assert_quiet()
            finally:
                release.set()
        assert [c.meta.message_id for c in others.calls] == [sent.message_id]
        assert len(holder.calls) == 1

    async def test_coalesced_reruns_are_capped_then_handed_off(self, harness: WorldHarness) -> None:
        """After MAX_COALESCED_RERUNS re-runs the message is handed off (seed 003, F1)."""
        run_id = ids.new_run_id()
        cap = constants.MAX_COALESCED_RERUNS
        recorder = queue.Recorder()
        handed_off = asyncio.Event()

        async with queue.opened(harness) as world:
            require(world, serializes_runs=True, coalesces=True)

            async def feed_self(
                message: queue.Message, meta: messages.DeliveryMeta
            ) -> messages.Ack:
                await recorder(message, meta)
                if meta.rerun == 0 and meta.delivery_count > 1:
                    handed_off.set()
                if not handed_off.is_set() and len(recorder.calls) <= cap + 8:
                    # An uncovered message for the holder's own run, on every call.
                    await world.queue.send(queue.orchestrator_message(run_id))
                return messages.ACK

            async with queue.consuming(world, {"orchestrator": feed_self}):
                sent = await world.queue.send(queue.orchestrator_message(run_id))
                calls = [await recorder.next() for _ in range(cap + 2)]
        first_delivery, after_handoff = calls[: cap + 1], calls[cap + 1]
        assert [(c.meta.rerun, c.meta.delivery_count) for c in first_delivery] == [
            (n, n + 1) for n in range(cap + 1)
        ]
        assert {c.meta.attempt for c in first_delivery} == {1}
        started = {c.meta.invocation_started_at for c in first_delivery}
        assert len(started) == 1
        assert {c.meta.message_id for c in calls} == {sent.message_id}
        meta = after_handoff.meta
        assert (meta.delivery_count, meta.attempt, meta.rerun) == (2, 1, 0)

    async def test_handoff_goes_to_the_front_of_its_runs_line(self, harness: WorldHarness) -> None:
        """A handed-off message is the run's next delivery, ahead of the run's other due message."""
        run_id = ids.new_run_id()
        recorder = queue.Recorder()
        other: list[messages.SendResult] = []

        async with queue.opened(harness) as world:
            require(world, serializes_runs=True)

            async def hand_off_first(
                message: queue.Message, meta: messages.DeliveryMeta
            ) -> messages.HandlerResult:
                await recorder(message, meta)
                if len(recorder.calls) > 1:
                    return messages.ACK
                other.append(await world.queue.send(queue.orchestrator_message(run_id)))
                return messages.HANDOFF

            async with queue.consuming(world, {"orchestrator": hand_off_first}):
                sent = await world.queue.send(queue.orchestrator_message(run_id))
                first, after = await recorder.next(), await recorder.next()
                # Let the other message be delivered or coalesced before closing.
                await recorder.drain()
        assert first.meta.message_id == sent.message_id
        assert after.meta.message_id == sent.message_id, "the other message overtook the handoff"
        assert (after.meta.delivery_count, after.meta.attempt) == (2, 1)
        assert other[0].message_id != sent.message_id
