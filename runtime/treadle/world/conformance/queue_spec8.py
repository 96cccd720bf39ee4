"""Queue conformance for spec 8 runs: never gated, never coalesced, keys as documented.

Pins issue 12 item 2's queue half (seed 003 "Spec 8 queues, as in earlier
releases", "The dedupe contract"; seed 000 "Why the non-owner action is a delayed
backstop wake"): an orchestrator message stamped ``run_spec_version=8`` runs beside
any other message of its run (two at once), each its own delivery (never folded
into a holder as a re-run), keyed sends are deduplicated while the first message
lives and after it was acknowledged, ``Redeliver(n)`` brings the same message back
after ``n`` seconds; and seed 000's backstop key walk, against the real queue: a
re-arm within one ownership epoch is dropped even while the backstop is in flight,
the next epoch's key (after owner recovery re-stamps) makes a new message, and a
pending backstop never absorbs the step's own message (different keys). These run
on every World, whatever its gating capabilities. Helpers come from ``queue`` and
``queue_gating``.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from treadle.orchestrator.spec8 import ownership
from treadle.world import constants, contract, ids, messages
from treadle.world.conformance import queue
from treadle.world.conformance.harness import WorldHarness
from treadle.world.conformance.queue_gating import Rendezvous

SPEC_8 = constants.SPEC_VERSION_LEGACY


def spec8_message(run_id: str) -> messages.OrchestratorMessage:
    """A spec 8 orchestrator message (a wake, a continuation, a backstop)."""
    return queue.orchestrator_message(run_id, spec_version=SPEC_8)


def spec8_step_message(run_id: str, step_id: str) -> messages.StepMessage:
    return messages.StepMessage(
        run_id=run_id,
        step_id=step_id,
        step_name="add",
        run_context=messages.RunContext(spec_version=SPEC_8, workflow_name="wf"),
        step_created_at=datetime.now(UTC),
    )


def step_key(run_id: str, step_id: str) -> str:
    """The key a spec 8 delivery sends a step's own message under."""
    return f"step:{run_id}:{step_id}"


class Spec8QueueConformance:
    """Spec 8 queue rules; subclass it as ``Test...`` with a harness."""

    async def test_two_spec_8_messages_of_one_run_are_delivered_at_once(
        self, harness: WorldHarness
    ) -> None:
        """Two orchestrator messages of one spec 8 run are both inside their handlers at the
        same time (a wake runs beside a delivery holding an inline step)."""
        rendezvous = Rendezvous(2)
        recorder = queue.Recorder()

        async def meet(message: queue.Message, meta: messages.DeliveryMeta) -> messages.Ack:
            await recorder(message, meta)
            await rendezvous.meet()
            return messages.ACK

        run_id = ids.new_run_id()
        async with queue.opened(harness) as world, queue.consuming(world, {"orchestrator": meet}):
            sent = [await world.queue.send(spec8_message(run_id)) for _ in range(2)]
            await asyncio.wait_for(rendezvous.all_in.wait(), queue.WAIT_SECONDS)
        assert {c.meta.message_id for c in recorder.calls} == {s.message_id for s in sent}

    async def test_spec_8_messages_of_a_held_run_are_never_coalesced(
        self, harness: WorldHarness
    ) -> None:
        """Messages sent while a spec 8 delivery of their run is held are each delivered on
        their own (delivery_count 1, rerun 0, their own ids), and the holder is never re-run."""
        run_id = ids.new_run_id()
        entered, release = asyncio.Event(), asyncio.Event()
        holder, others = queue.Recorder(), queue.Recorder()
        first_id: list[str] = []

        async def handle(message: queue.Message, meta: messages.DeliveryMeta) -> messages.Ack:
            if not first_id or meta.message_id == first_id[0]:
                await holder(message, meta)
                entered.set()
                await asyncio.wait_for(release.wait(), queue.WAIT_SECONDS)
                return messages.ACK
            await others(message, meta)
            return messages.ACK

        async with queue.opened(harness) as world:
            try:
                async with queue.consuming(world, {"orchestrator": handle}):
                    sent = await world.queue.send(spec8_message(run_id))
                    first_id.append(sent.message_id)
                    await asyncio.wait_for(entered.wait(), queue.WAIT_SECONDS)
                    more = [await world.queue.send(spec8_message(run_id)) for _ in range(3)]
                    # Delivered while the holder still waits for release.
                    calls = [await others.next() for _ in range(3)]
                    release.set()
                    await holder.next()
                    await holder.assert_quiet()
            finally:
                release.set()
        assert {c.meta.message_id for c in calls} == {m.message_id for m in more}
        assert len({m.message_id for m in more} | {sent.message_id}) == 4
        assert {(c.meta.delivery_count, c.meta.attempt, c.meta.rerun) for c in calls} == {(1, 1, 0)}
        assert [(c.meta.delivery_count, c.meta.rerun) for c in holder.calls] == [(1, 0)]
        assert len(others.calls) == 3

    async def test_keyed_spec_8_send_is_deduplicated_in_flight_and_after_ack(
        self, harness: WorldHarness
    ) -> None:
        """A keyed spec 8 send is deduplicated while its message is being delivered and after
        it was acknowledged (the dedupe contract's window); an unkeyed one never is."""
        run_id = ids.new_run_id()
        recorder = queue.Recorder()
        in_flight: list[messages.SendResult] = []
        async with queue.opened(harness) as world:

            async def resend(message: queue.Message, meta: messages.DeliveryMeta) -> messages.Ack:
                await recorder(message, meta)
                if not in_flight:
                    in_flight.append(await world.queue.send(spec8_message(run_id), key="w_1"))
                return messages.ACK

            async with queue.consuming(world, {"orchestrator": resend}):
                first = await world.queue.send(spec8_message(run_id), key="w_1")
                await recorder.next()
                await recorder.assert_quiet()
            after_ack = await world.queue.send(spec8_message(run_id), key="w_1")
            unkeyed = await world.queue.send(spec8_message(run_id))
            async with queue.consuming(world, {"orchestrator": recorder}):
                assert (await recorder.next()).meta.message_id == unkeyed.message_id
                await recorder.assert_quiet()
        dropped = messages.SendResult(first.message_id, deduplicated=True)
        assert in_flight == [dropped]
        assert after_ack == dropped
        assert not unkeyed.deduplicated
        assert len(recorder.calls) == 2

    async def test_redeliver_brings_the_same_spec_8_message_back_after_the_delay(
        self, harness: WorldHarness
    ) -> None:
        """Redeliver(n) on a spec 8 message: the same message id again after n seconds,
        counted; spec 8 keeps the earlier releases' continuation by redelivery."""
        async with queue.opened(harness) as world:
            recorder = queue.Recorder(messages.Redeliver(0.3))
            async with queue.consuming(world, {"orchestrator": recorder}):
                sent = await world.queue.send(spec8_message(ids.new_run_id()))
                first, second = await recorder.next(), await recorder.next()
                await recorder.assert_quiet()
        assert first.meta.message_id == second.meta.message_id == sent.message_id
        assert (queue.counts(first), queue.counts(second)) == ((1, 1), (2, 2))
        assert second.at - recorder.answered_at[0] >= 0.3 - queue.SLACK_SECONDS

    async def test_backstop_key_walk_across_an_owner_recovery(self, harness: WorldHarness) -> None:
        """Seed 000's re-arm sequence on the real queue: a backstop keyed for epoch t1 is in
        flight; a re-arm under that key is dropped; owner recovery re-stamps (epoch t2) and
        the re-arm under the new key is a new message, delivered beside the first."""
        run_id, cid = ids.new_run_id(), "step_1"
        t1 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
        t2 = t1 + timedelta(seconds=7)
        key1, key2 = ownership.backstop_key(cid, t1), ownership.backstop_key(cid, t2)
        assert key1 == f"{cid}:backstop:2026-03-01T12:00:00.123456Z"
        assert key1 != key2
        first_in, second_in, release = asyncio.Event(), asyncio.Event(), asyncio.Event()
        recorder = queue.Recorder()

        async def hold(message: queue.Message, meta: messages.DeliveryMeta) -> messages.Ack:
            await recorder(message, meta)
            (second_in if first_in.is_set() else first_in).set()
            await asyncio.wait_for(release.wait(), queue.WAIT_SECONDS)
            return messages.ACK

        async with queue.opened(harness) as world:
            try:
                async with queue.consuming(world, {"orchestrator": hold}):
                    backstop = await world.queue.send(spec8_message(run_id), key=key1)
                    await asyncio.wait_for(first_in.wait(), queue.WAIT_SECONDS)
                    # The backstop fires; its replay re-arms within the same epoch.
                    rearm = await world.queue.send(spec8_message(run_id), key=key1)
                    # Owner recovery re-stamped the step: a new epoch, a new key.
                    next_epoch = await world.queue.send(spec8_message(run_id), key=key2)
                    await asyncio.wait_for(second_in.wait(), queue.WAIT_SECONDS)
                    calls = [await recorder.next() for _ in range(2)]
                    release.set()
                    await recorder.assert_quiet()
            finally:
                release.set()
        assert rearm == messages.SendResult(backstop.message_id, deduplicated=True)
        assert not next_epoch.deduplicated
        assert next_epoch.message_id != backstop.message_id
        delivered = [(c.meta.message_id, c.meta.key) for c in calls]
        assert delivered == [(backstop.message_id, key1), (next_epoch.message_id, key2)]

    async def test_a_pending_backstop_never_absorbs_the_steps_own_message(
        self, harness: WorldHarness
    ) -> None:
        """With a backstop pending (delayed), the step's message keyed step:<run>:<cid> is a
        message of its own, delivered at once, not held for the backstop's delay (seed 000's
        first rejected backstop shape)."""
        run_id, cid = ids.new_run_id(), "step_1"
        key = ownership.backstop_key(cid, datetime(2026, 3, 1, tzinfo=UTC))
        recorder = queue.Recorder()
        handlers: dict[messages.MessageKind, contract.Handler] = {
            "orchestrator": recorder,
            "step": recorder,
        }
        async with queue.opened(harness) as world, queue.consuming(world, handlers):
            sent_at = time.monotonic()
            backstop = await world.queue.send(spec8_message(run_id), key=key, delay_seconds=1.0)
            step = await world.queue.send(
                spec8_step_message(run_id, cid), key=step_key(run_id, cid)
            )
            first = await recorder.next()
            second = await recorder.next()
        assert not step.deduplicated
        assert step.message_id != backstop.message_id
        assert (first.meta.message_id, first.meta.key) == (step.message_id, step_key(run_id, cid))
        assert first.at - sent_at < 1.0, "the step message waited for the backstop's delay"
        assert second.meta.message_id == backstop.message_id
        assert second.at - sent_at >= 1.0 - queue.SLACK_SECONDS
