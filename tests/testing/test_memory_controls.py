"""The in-memory backend's simulation controls and views (SIM-INTERFACE.md).

force_lease_lapse, consumer.kill, drop_feeds, in_flight, queued, next_due, stats,
events_of, lease_lost on a lapse, and a seeded rng giving one delivery order.
"""

from __future__ import annotations

import asyncio
import random
import time

from treadle import clock
from treadle.testing.memory import MemoryBackend, MemoryWorld
from treadle.world import constants, events, messages

from .memory_support import FAST, WAIT, Deliveries, orchestrator_message, step_message

SPEC = constants.SPEC_VERSION_SINGLE_ORCHESTRATOR


async def test_force_lease_lapse_redelivers_and_voids_the_old_delivery() -> None:
    """The holder's lease_lost is set, the message is delivered again (2, 2), its ack void."""
    backend = MemoryBackend()
    world = MemoryWorld(backend, tuning=FAST)
    handler = Deliveries()
    handler.hold = True
    consumer = await world.queue.consume({"step": handler})
    try:
        sent = await world.queue.send(step_message())
        first = await handler.next()
        assert first.lease_lost is not None and not first.lost_lease()
        assert backend.force_lease_lapse(sent.message_id) is True
        assert first.lost_lease()
        second = await handler.next()  # while the first delivery still runs
        assert (second.message_id, second.delivery_count, second.attempt) == (
            sent.message_id, 2, 2,
        )  # fmt: skip
        assert not second.lost_lease()
        handler.release.set()
        await consumer.close(grace_seconds=5)
    finally:
        handler.release.set()
        await world.close()
    assert backend.queued() == 0
    assert backend.force_lease_lapse(sent.message_id) is False
    counters = backend.stats.total
    assert (counters.deliveries, counters.lease_lapses, counters.redeliveries) == (2, 1, 1)


async def test_a_lease_that_lapses_under_a_stall_sets_lease_lost() -> None:
    """A handler holding the loop past its lease finds lease_lost set once the loop runs."""
    backend = MemoryBackend()
    world = MemoryWorld(backend, tuning=FAST)
    lost: list[bool] = []
    done = asyncio.Event()

    async def stall(message: object, meta: messages.DeliveryMeta) -> messages.Ack:
        if meta.delivery_count == 1:
            time.sleep(FAST.lease_seconds * 1.5)
            await asyncio.sleep(0.01)  # the loop runs: the lease's timer fires
            lost.append(meta.lost_lease())
            done.set()
        return messages.ACK

    consumer = await world.queue.consume({"step": stall})
    try:
        await world.queue.send(step_message())
        await asyncio.wait_for(done.wait(), WAIT)
    finally:
        await consumer.close(grace_seconds=2)
    assert lost == [True]
    assert backend.stats.total.lease_lapses == 1


async def test_a_killed_consumer_settles_nothing_and_its_lease_lapses() -> None:
    """kill(): the in-flight delivery is abandoned unsettled; another process gets it, counted."""
    backend = MemoryBackend()
    dying, survivor = MemoryWorld(backend, tuning=FAST), MemoryWorld(backend, tuning=FAST)
    first = Deliveries()
    first.hold = True
    doomed = await dying.memory_queue.consume_memory({"step": first})
    sent = await dying.queue.send(step_message())
    await first.next()
    (flight,) = backend.in_flight()
    assert (flight.message_id, flight.world, flight.consumer) == (
        sent.message_id, dying.name, doomed.name,
    )  # fmt: skip
    dying.kill()
    killed_at = clock.monotonic()
    first.release.set()  # the body finishes, but a dead process's ack must not land
    second = Deliveries()
    consumer = await survivor.queue.consume({"step": second})
    try:
        meta = await second.next()
        assert clock.monotonic() - killed_at >= FAST.lease_seconds * 0.9
    finally:
        await consumer.close(grace_seconds=1)
        await dying.close()
    assert (meta.message_id, meta.delivery_count, meta.attempt) == (sent.message_id, 2, 2)
    assert len(first.calls) == 1
    assert backend.queued() == 0


async def test_drop_feeds_breaks_the_runs_subscriptions_only() -> None:
    """drop_feeds(run): its subscribers hear ConnectionError and get nothing more."""
    backend = MemoryBackend()
    world = MemoryWorld(backend)
    runs = [
        (
            await world.runs.create(
                workflow_name="wf", input=None, deployment_id="d", spec_version=SPEC
            )
        ).run_id
        for _ in range(2)
    ]
    got: dict[str, list[int]] = {r: [] for r in runs}
    errors_seen: dict[str, list[BaseException]] = {r: [] for r in runs}
    arrived = asyncio.Event()

    def watcher(run_id: str) -> tuple[object, object]:
        def on_event(e: events.LoggedEvent) -> None:
            got[run_id].append(e.slot)
            arrived.set()

        return on_event, errors_seen[run_id].append

    subs = [world.events.subscribe(r, 0, *watcher(r)) for r in runs]  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert got == {r: [1] for r in runs}
    assert backend.drop_feeds(runs[0]) == 1
    assert [type(e) for e in errors_seen[runs[0]]] == [ConnectionError]
    for run_id in runs:
        await world.events.create(run_id, events.AttrSet(key="a"), in_band=False)
    arrived.clear()
    await asyncio.wait_for(arrived.wait(), WAIT)
    assert got == {runs[0]: [1], runs[1]: [1, 2]}
    assert errors_seen[runs[1]] == []
    for sub in subs:
        sub.close()


async def test_views_count_queued_delayed_in_flight_and_per_run_stats() -> None:
    """queued, next_due, in_flight, events_of and the per-run counters say what happened."""
    backend = MemoryBackend()
    world = MemoryWorld(backend, tuning=FAST)
    run = await world.runs.create(
        workflow_name="wf", input=None, deployment_id="d", spec_version=SPEC
    )
    before = clock.monotonic()
    await world.queue.send(step_message(run.run_id), delay_seconds=60)
    await world.queue.send(step_message(run.run_id, "s2"), key="k")
    await world.queue.send(step_message(run.run_id, "s2"), key="k")
    due = backend.next_due()
    assert due is not None and before <= due <= clock.monotonic()  # s2 is due now
    assert backend.queued() == 2 and backend.in_flight() == []
    handler = Deliveries()
    handler.hold = True
    consumer = await world.queue.consume({"step": handler, "orchestrator": handler})
    try:
        await handler.next()
        assert [f.run_id for f in backend.in_flight()] == [run.run_id]
        next_due = backend.next_due()
        assert next_due is not None and next_due >= before + 60
        await world.queue.send(orchestrator_message(run.run_id))
        await handler.next()
        handler.release.set()
    finally:
        handler.release.set()
        await consumer.close(grace_seconds=2)
    assert backend.queued() == 1  # the delayed one
    counters = backend.stats.of(run.run_id)
    assert (counters.sends, counters.deduplicated, counters.deliveries) == (4, 1, 2)
    assert backend.stats.of("wrun_unknown").sends == 0
    assert backend.events_of(run.run_id) == list((await world.events.list(run.run_id)).events)


async def _delivery_order(seed: int | None, count: int = 12) -> list[str]:
    """The order a one-at-a-time consumer takes ``count`` ready messages in."""
    backend = MemoryBackend(rng=None if seed is None else random.Random(seed))
    world = MemoryWorld(backend, tuning=FAST)
    for i in range(count):
        await world.queue.send(step_message(step_id=f"s{i}"))
    handler = Deliveries()
    consumer = await world.queue.consume({"step": handler}, concurrency=1)
    try:
        for _ in range(count):
            await handler.next()
    finally:
        await consumer.close(grace_seconds=1)
    return [m.step_id for m, _ in handler.calls if isinstance(m, messages.StepMessage)]


async def test_a_seeded_rng_gives_one_delivery_order() -> None:
    """Same seed, same order of ready messages; another seed, another order; no rng: FIFO."""
    first, again, other = (
        await _delivery_order(3),
        await _delivery_order(3),
        await _delivery_order(4),
    )
    assert first == again
    assert sorted(first) == sorted(other) and first != other
    assert await _delivery_order(None, 5) == [f"s{i}" for i in range(5)]
