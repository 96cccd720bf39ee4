"""Queue conformance: message identity, handler results, leases, dedupe, delays, restarts.

Pins the queue half of the World contract (``contract.Queue``, DESIGN.md 3.2, seed
003 "Spec 9 queue rules" and "The dedupe contract"); ``queue_gating`` pins the
per-run gate and coalescing with the helpers defined here. A World's test module
subclasses ``QueueConformance`` and provides a ``harness`` fixture. Every test opens
its World with short queue timings (``FAST``) and waits on handler signals, never
on sleeps; a sleep only bounds a window in which something must not happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeAlias

import pytest
from pydantic import JsonValue

from treadle import errors
from treadle.world import constants, contract, ids, messages
from treadle.world.conformance.harness import WorldHarness

Message: TypeAlias = messages.OrchestratorMessage | messages.StepMessage

FAST = contract.QueueTuning(lease_seconds=0.5, backoff_base_seconds=0.05, backoff_max_seconds=0.2)
# How long to wait for something that must happen.
WAIT_SECONDS = 10.0
# A window in which something must not happen.
QUIET_SECONDS = 0.5
# Clock rounding allowed when checking that a delay was not cut short.
SLACK_SECONDS = 0.01
CLOSE_GRACE_SECONDS = 2.0
SPEC_VERSION = constants.SPEC_VERSION_SINGLE_ORCHESTRATOR


@contextlib.asynccontextmanager
async def opened(
    harness: WorldHarness, tuning: contract.QueueTuning = FAST
) -> AsyncIterator[contract.World]:
    """Open the World under test and always close it."""
    world = await harness.open(tuning)
    try:
        yield world
    finally:
        await world.close()


@contextlib.asynccontextmanager
async def consuming(
    world: contract.World,
    handlers: Mapping[messages.MessageKind, contract.Handler],
    *,
    concurrency: int = 8,
) -> AsyncIterator[contract.Consumer]:
    """Consume with ``handlers`` and always close the consumer."""
    consumer = await world.queue.consume(handlers, concurrency=concurrency)
    try:
        yield consumer
    finally:
        await consumer.close(grace_seconds=CLOSE_GRACE_SECONDS)


def orchestrator_message(
    run_id: str,
    *,
    spec_version: int = SPEC_VERSION,
    wait_continuation: messages.WaitContinuation | None = None,
) -> messages.OrchestratorMessage:
    return messages.OrchestratorMessage(
        run_id=run_id, run_spec_version=spec_version, wait_continuation=wait_continuation
    )


def step_message(
    run_id: str | None = None, *, step_id: str = "step_1", input: JsonValue = None
) -> messages.StepMessage:
    return messages.StepMessage(
        run_id=run_id or ids.new_run_id(),
        step_id=step_id,
        step_name="add",
        run_context=messages.RunContext(spec_version=SPEC_VERSION, workflow_name="wf"),
        step_created_at=datetime.now(UTC),
        input=input,
    )


@dataclass(frozen=True, slots=True)
class Delivery:
    """One handler call as a test saw it: when it began and when it answered."""

    message: Message
    meta: messages.DeliveryMeta
    at: float


class Recorder:
    """A handler recording every call; it answers from a script, then with ACK.

    A script entry that is an exception is raised instead of returned.
    """

    def __init__(self, *script: messages.HandlerResult | Exception) -> None:
        self.calls: list[Delivery] = []
        self.answered_at: list[float] = []
        self._script = list(script)
        self._arrivals: asyncio.Queue[Delivery] = asyncio.Queue()

    async def __call__(
        self, message: Message, meta: messages.DeliveryMeta
    ) -> messages.HandlerResult:
        delivery = Delivery(message, meta, time.monotonic())
        self.calls.append(delivery)
        self._arrivals.put_nowait(delivery)
        answer = self._script.pop(0) if self._script else messages.ACK
        self.answered_at.append(time.monotonic())
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def next(self) -> Delivery:
        """The next call, waited for."""
        return await asyncio.wait_for(self._arrivals.get(), WAIT_SECONDS)

    async def drain(self, seconds: float = QUIET_SECONDS) -> list[Delivery]:
        """Every further call, until none arrives for ``seconds``."""
        drained: list[Delivery] = []
        for _ in range(1000):
            try:
                drained.append(await asyncio.wait_for(self._arrivals.get(), seconds))
            except TimeoutError:
                return drained
        raise AssertionError("deliveries never stopped")

    async def assert_quiet(self, seconds: float = QUIET_SECONDS) -> None:
        """No further call arrives within ``seconds``."""
        await asyncio.sleep(seconds)
        assert self._arrivals.empty(), f"unexpected delivery {self._arrivals.get_nowait()}"


def counts(delivery: Delivery) -> tuple[int, int]:
    return delivery.meta.delivery_count, delivery.meta.attempt


BOTH_KINDS = ["orchestrator", "step"]


def message_of_kind(kind: str) -> Message:
    return orchestrator_message(ids.new_run_id()) if kind == "orchestrator" else step_message()


class QueueConformance:
    """Delivery, results, leases, dedupe, delays and restarts; subclass it as ``Test...``."""

    @pytest.mark.parametrize("kind", BOTH_KINDS)
    async def test_message_id_is_stable_and_the_first_delivery_counts_one(
        self, harness: WorldHarness, kind: str
    ) -> None:
        """The handler sees the send's message_id and key; the first delivery is (1, 1)."""
        async with opened(harness) as world:
            recorder = Recorder()
            async with consuming(world, {"orchestrator": recorder, "step": recorder}):
                sent = await world.queue.send(message_of_kind(kind), key="k1")
                first = await recorder.next()
                assert first.meta.message_id == sent.message_id
                assert sent.deduplicated is False
                assert (counts(first), first.meta.key, first.meta.rerun) == ((1, 1), "k1", 0)
                await recorder.assert_quiet()

    async def test_redeliver_delivers_the_same_message_after_the_delay_counted(
        self, harness: WorldHarness
    ) -> None:
        """Redeliver(n): the same message after n seconds, counted as an attempt."""
        async with opened(harness) as world:
            recorder = Recorder(messages.Redeliver(0.2))
            async with consuming(world, {"step": recorder}):
                sent = await world.queue.send(step_message())
                first, second = await recorder.next(), await recorder.next()
                assert first.meta.message_id == second.meta.message_id == sent.message_id
                assert (counts(first), counts(second)) == ((1, 1), (2, 2))
                assert second.at - recorder.answered_at[0] >= 0.2 - SLACK_SECONDS
                await recorder.assert_quiet()

    @pytest.mark.parametrize("kind", BOTH_KINDS)
    async def test_handoff_delivers_again_at_once_without_counting_an_attempt(
        self, harness: WorldHarness, kind: str
    ) -> None:
        """Handoff: the same message again at once, attempt unchanged; then Redeliver counts."""
        slow_backoff = contract.QueueTuning(
            lease_seconds=0.5, backoff_base_seconds=5.0, backoff_max_seconds=5.0
        )
        async with opened(harness, slow_backoff) as world:
            recorder = Recorder(messages.HANDOFF, messages.Redeliver(0.05))
            async with consuming(world, {"orchestrator": recorder, "step": recorder}):
                sent = await world.queue.send(message_of_kind(kind))
                calls = [await recorder.next() for _ in range(3)]
                assert {c.meta.message_id for c in calls} == {sent.message_id}
                assert [counts(c) for c in calls] == [(1, 1), (2, 1), (3, 2)]
                # At once: not after the 5 s backoff a failed delivery would wait.
                assert calls[1].at - recorder.answered_at[0] < 1.0
                await recorder.assert_quiet()

    async def test_handler_exception_redelivers_after_backoff_counted(
        self, harness: WorldHarness
    ) -> None:
        """A raising handler gets the same message again after the backoff, counted."""
        tuning = contract.QueueTuning(
            lease_seconds=0.5, backoff_base_seconds=0.2, backoff_max_seconds=0.2
        )
        async with opened(harness, tuning) as world:
            recorder = Recorder(RuntimeError("handler failed on purpose"))
            async with consuming(world, {"step": recorder}):
                sent = await world.queue.send(step_message())
                first, second = await recorder.next(), await recorder.next()
                assert second.meta.message_id == sent.message_id
                assert (counts(first), counts(second)) == ((1, 1), (2, 2))
                assert second.at - recorder.answered_at[0] >= 0.2 - SLACK_SECONDS
                await recorder.assert_quiet()

    async def test_delivery_stuck_past_its_lease_is_delivered_again_and_its_late_ack_ignored(
        self, harness: WorldHarness
    ) -> None:
        """A delivery stalled past its lease is redelivered, counted; its late ACK is void."""
        async with opened(harness) as world:
            recorder = Recorder()

            async def stall_first(message: Message, meta: messages.DeliveryMeta) -> messages.Ack:
                await recorder(message, meta)
                if meta.delivery_count == 1:
                    # The whole event loop stalls, so no heartbeat can renew the lease.
                    time.sleep(1.0)  # noqa: ASYNC251
                return messages.ACK

            async with consuming(world, {"step": stall_first}):
                sent = await world.queue.send(step_message())
                first, second = await recorder.next(), await recorder.next()
                assert first.meta.message_id == second.meta.message_id == sent.message_id
                assert (counts(first), counts(second)) == ((1, 1), (2, 2))
                await recorder.assert_quiet()

    async def test_live_delivery_keeps_its_lease_past_the_lease_time(
        self, harness: WorldHarness
    ) -> None:
        """A live handler running three leases long is delivered once (heartbeats renew it)."""
        async with opened(harness) as world:
            recorder = Recorder()
            finished = asyncio.Event()

            async def slow(message: Message, meta: messages.DeliveryMeta) -> messages.Ack:
                await recorder(message, meta)
                await asyncio.sleep(3 * FAST.lease_seconds)  # the loop stays free: the point
                finished.set()
                return messages.ACK

            async with consuming(world, {"step": slow}):
                await world.queue.send(step_message())
                assert counts(await recorder.next()) == (1, 1)
                await asyncio.wait_for(finished.wait(), WAIT_SECONDS)
                await recorder.assert_quiet()
                assert len(recorder.calls) == 1

    async def test_keyed_send_is_deduplicated(self, harness: WorldHarness) -> None:
        """A second send under a key returns the first message_id, deduplicated; one delivery."""
        async with opened(harness) as world:
            first = await world.queue.send(step_message(), key="k")
            again = await world.queue.send(step_message(), key="k")
            assert (first.deduplicated, again.deduplicated) == (False, True)
            assert again.message_id == first.message_id
            recorder = Recorder()
            async with consuming(world, {"step": recorder}):
                assert (await recorder.next()).meta.message_id == first.message_id
                await recorder.assert_quiet()

    async def test_keyed_send_is_deduplicated_while_the_first_is_delayed(
        self, harness: WorldHarness
    ) -> None:
        """A keyed re-send next to a delayed message neither duplicates nor advances it."""
        async with opened(harness) as world:
            recorder = Recorder()
            async with consuming(world, {"step": recorder}):
                sent_at = time.monotonic()
                first = await world.queue.send(step_message(), key="k", delay_seconds=0.5)
                again = await world.queue.send(step_message(), key="k")
                assert again == messages.SendResult(first.message_id, deduplicated=True)
                delivery = await recorder.next()
                assert delivery.meta.message_id == first.message_id
                assert delivery.at - sent_at >= 0.5 - SLACK_SECONDS
                await recorder.assert_quiet()

    async def test_keyed_send_is_deduplicated_while_the_first_is_being_delivered(
        self, harness: WorldHarness
    ) -> None:
        """A keyed re-send while the first message's delivery runs makes no second message."""
        async with opened(harness) as world:
            recorder = Recorder()
            resent: list[messages.SendResult] = []

            async def resend(message: Message, meta: messages.DeliveryMeta) -> messages.Ack:
                await recorder(message, meta)
                if not resent:
                    resent.append(await world.queue.send(step_message(), key="k"))
                return messages.ACK

            async with consuming(world, {"step": resend}):
                first = await world.queue.send(step_message(), key="k")
                await recorder.next()
                await recorder.assert_quiet()
            assert resent == [messages.SendResult(first.message_id, deduplicated=True)]
            assert len(recorder.calls) == 1

    async def test_keyed_send_is_deduplicated_while_the_first_backs_off(
        self, harness: WorldHarness
    ) -> None:
        """A keyed re-send next to a message in backoff resets neither its attempts nor schedule."""
        tuning = contract.QueueTuning(
            lease_seconds=0.5, backoff_base_seconds=0.4, backoff_max_seconds=0.4
        )
        async with opened(harness, tuning) as world:
            recorder = Recorder(RuntimeError("handler failed on purpose"))
            async with consuming(world, {"step": recorder}):
                first = await world.queue.send(step_message(), key="k")
                await recorder.next()
                # The World's backoff state cannot be awaited; 0.1 s puts the re-send inside it.
                await asyncio.sleep(0.1)
                again = await world.queue.send(step_message(), key="k")
                assert again == messages.SendResult(first.message_id, deduplicated=True)
                second = await recorder.next()
                assert (second.meta.message_id, counts(second)) == (first.message_id, (2, 2))
                assert second.at - recorder.answered_at[0] >= 0.4 - SLACK_SECONDS
                await recorder.assert_quiet()

    async def test_keyed_send_is_deduplicated_after_the_first_was_acknowledged(
        self, harness: WorldHarness
    ) -> None:
        """A key stays taken after its message was acknowledged (the 24 h dedupe window)."""
        async with opened(harness) as world:
            recorder = Recorder()
            async with consuming(world, {"step": recorder}):
                first = await world.queue.send(step_message(), key="k")
                await recorder.next()
            # The consumer closed, so the acknowledgment has been applied.
            again = await world.queue.send(step_message(), key="k")
            assert again == messages.SendResult(first.message_id, deduplicated=True)
            async with consuming(world, {"step": recorder}):
                await recorder.assert_quiet()
            assert len(recorder.calls) == 1

    async def test_unkeyed_identical_sends_are_never_deduplicated(
        self, harness: WorldHarness
    ) -> None:
        """Two unkeyed sends of one message are two messages, each delivered."""
        async with opened(harness) as world:
            message = step_message()
            first = await world.queue.send(message)
            second = await world.queue.send(message)
            assert not first.deduplicated
            assert not second.deduplicated
            assert first.message_id != second.message_id
            recorder = Recorder()
            async with consuming(world, {"step": recorder}):
                delivered = {(await recorder.next()).meta.message_id for _ in range(2)}
                assert delivered == {first.message_id, second.message_id}
                await recorder.assert_quiet()

    async def test_send_batch_deduplicates_within_and_across_batches(
        self, harness: WorldHarness
    ) -> None:
        """send_batch dedupes a key repeated in the batch and one taken by an earlier batch."""
        async with opened(harness) as world:
            run_id = ids.new_run_id()
            a1, a2, b1, b2, c1 = (
                step_message(run_id, step_id=s) for s in ("a1", "a2", "b1", "b2", "c1")
            )
            first = await world.queue.send_batch(
                [messages.Send(a1, key="a"), messages.Send(a2, key="a"), messages.Send(b1, key="b")]
            )
            second = await world.queue.send_batch(
                [messages.Send(b2, key="b"), messages.Send(c1, key="c")]
            )
            assert [r.deduplicated for r in first] == [False, True, False]
            assert [r.deduplicated for r in second] == [True, False]
            assert first[1].message_id == first[0].message_id
            assert second[0].message_id == first[2].message_id
            assert len({first[0].message_id, first[2].message_id, second[1].message_id}) == 3
            recorder = Recorder()
            async with consuming(world, {"step": recorder}):
                calls = [await recorder.next() for _ in range(3)]
                await recorder.assert_quiet()
            delivered = {c.meta.message_id: c.message for c in calls}
            expected = {first[0].message_id: a1, first[2].message_id: b1, second[1].message_id: c1}
            assert delivered == expected

    async def test_delayed_send_is_never_delivered_early(self, harness: WorldHarness) -> None:
        """A send with delay_seconds is not delivered before the delay has passed."""
        async with opened(harness) as world:
            recorder = Recorder()
            async with consuming(world, {"step": recorder, "orchestrator": recorder}):
                sent_at = time.monotonic()
                await world.queue.send(step_message(), delay_seconds=0.3)
                await world.queue.send(orchestrator_message(ids.new_run_id()), delay_seconds=0.3)
                for _ in range(2):
                    assert (await recorder.next()).at - sent_at >= 0.3 - SLACK_SECONDS

    @pytest.mark.parametrize("delay", [-1.0, math.nan])
    async def test_negative_or_nan_delay_is_a_contract_error(
        self, harness: WorldHarness, delay: float
    ) -> None:
        """A negative or NaN delay_seconds is refused with WorldContractError."""
        async with opened(harness) as world:
            with pytest.raises(errors.WorldContractError):
                await world.queue.send(step_message(), delay_seconds=delay)

    async def test_message_over_the_size_limit_is_refused(self, harness: WorldHarness) -> None:
        """A message over the queue's size limit raises MessageTooLarge."""
        async with opened(harness) as world:
            with pytest.raises(errors.MessageTooLarge):
                await world.queue.send(step_message(input="x" * (200 * 1024)))

    async def test_restart_loses_no_message_and_keeps_keys(self, harness: WorldHarness) -> None:
        """Ready, delayed, keyed and in-flight messages survive a restart (seed 003)."""
        held = asyncio.Event()
        blocked_forever = asyncio.Event()

        async def hold(message: Message, meta: messages.DeliveryMeta) -> messages.Ack:
            held.set()
            await blocked_forever.wait()
            return messages.ACK

        async with opened(harness) as world:
            consumer = await world.queue.consume({"orchestrator": hold})
            try:
                in_flight = await world.queue.send(orchestrator_message(ids.new_run_id()))
                await asyncio.wait_for(held.wait(), WAIT_SECONDS)
                ready = await world.queue.send(step_message(step_id="ready"))
                delayed_at = time.monotonic()
                delayed = await world.queue.send(step_message(step_id="delayed"), delay_seconds=0.5)
                keyed = await world.queue.send(step_message(step_id="keyed"), key="k")
            finally:
                await consumer.close(grace_seconds=0)
        async with opened(harness) as world:
            recorder = Recorder()
            async with consuming(world, {"orchestrator": recorder, "step": recorder}):
                calls = {c.meta.message_id: c for c in [await recorder.next() for _ in range(4)]}
                assert set(calls) == {m.message_id for m in (in_flight, ready, delayed, keyed)}
                assert counts(calls[in_flight.message_id]) == (2, 2)
                for sent in (ready, delayed, keyed):
                    assert counts(calls[sent.message_id]) == (1, 1)
                assert calls[delayed.message_id].at - delayed_at >= 0.5 - SLACK_SECONDS
                again = await world.queue.send(step_message(step_id="keyed"), key="k")
                assert again == messages.SendResult(keyed.message_id, deduplicated=True)
                await recorder.assert_quiet()

    async def test_consumer_close_waits_for_a_running_handler_and_applies_its_result(
        self, harness: WorldHarness
    ) -> None:
        """close(grace) lets a running handler finish and acknowledges its message."""
        entered, release = asyncio.Event(), asyncio.Event()
        finished: list[bool] = []

        async def finish_late(message: Message, meta: messages.DeliveryMeta) -> messages.Ack:
            entered.set()
            await asyncio.wait_for(release.wait(), WAIT_SECONDS)
            finished.append(True)
            return messages.ACK

        async with opened(harness) as world:
            consumer = await world.queue.consume({"step": finish_late})
            closing: asyncio.Task[None] | None = None
            try:
                await world.queue.send(step_message())
                await asyncio.wait_for(entered.wait(), WAIT_SECONDS)
                closing = asyncio.create_task(consumer.close(grace_seconds=5))
                await asyncio.sleep(0.2)
                assert not closing.done(), "close() returned while a handler was running"
                release.set()
                await asyncio.wait_for(closing, WAIT_SECONDS)
                assert finished == [True]
            finally:
                release.set()
                if closing is None:
                    await consumer.close(grace_seconds=CLOSE_GRACE_SECONDS)
                elif not closing.done():
                    await closing
        async with opened(harness) as world:
            recorder = Recorder()
            async with consuming(world, {"step": recorder}):
                await recorder.assert_quiet()
