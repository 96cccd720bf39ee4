"""Worker liveness on the memory World (``treadle.world.liveness``; docs/recovery.md).

The rules the NATS queue applies with its KV heartbeats, as the memory World applies
them: a consumer started with a dead worker's identity releases what it held at once
(restart in place); a worker whose heartbeat stops (killed, or its beats lost) loses
its leases once silent past its liveness, told through ``lease_lost``, and a survivor
gets the message then, long before the lease.
"""

from __future__ import annotations

import asyncio
import dataclasses

from treadle.testing.memory import MemoryBackend, MemoryWorld
from treadle.world import contract, ids, liveness

from .memory_support import Deliveries, orchestrator_message, step_message

# A lease no test may wait out: each wait below is bounded well under it.
LONG = contract.QueueTuning(lease_seconds=60.0, liveness_seconds=0.5)
BOUND = 10.0
SLOW = dataclasses.replace(LONG, liveness_seconds=60.0)


class LoseBeats:
    """An interceptor dropping every worker heartbeat (its writes failing)."""

    async def before(self, point: str, run_id: str | None) -> str:
        return "lose" if point == "queue.beat" else "proceed"


def _as(worker_id: str, tuning: contract.QueueTuning = LONG) -> contract.QueueTuning:
    return dataclasses.replace(tuning, worker_id=worker_id)


async def test_a_consumer_with_a_dead_workers_identity_releases_its_leases_at_start() -> None:
    backend = MemoryBackend(tuning=LONG)
    dead = MemoryWorld(backend, tuning=_as("pod-a", SLOW))  # no takeover: the restart acts
    held = Deliveries()
    held.hold = True
    await dead.queue.consume({"step": held})
    sent = await dead.queue.send(step_message())
    first = await held.next()
    dead.kill()
    again = MemoryWorld(backend, tuning=_as("pod-a"))
    taken = Deliveries()
    try:
        await again.queue.consume({"step": taken})
        second = await taken.next(BOUND)
        assert (second.message_id, second.delivery_count) == (sent.message_id, 2)
        assert first.lost_lease()
        assert backend.stats.total.restart_releases == 1
    finally:
        held.release.set()
        await again.close()


async def test_another_identity_releases_nothing_at_start() -> None:
    """Only the same identity restarts in place: a new worker leaves a live one's leases.

    Waited on an event, not a sleep: the new worker's start-up release runs in
    ``consume`` itself, and a probe message only it consumes (an orchestrator message:
    the live worker takes steps only) shows its dispatch loop has claimed what was due;
    by then it has neither released nor taken the live worker's step.
    """
    backend = MemoryBackend(tuning=LONG)
    live = MemoryWorld(backend, tuning=_as("pod-a", SLOW))
    held = Deliveries()
    held.hold = True
    await live.queue.consume({"step": held})
    await live.queue.send(step_message())
    first = await held.next()
    other = MemoryWorld(backend, tuning=_as("pod-b"))
    steps, probes = Deliveries(), Deliveries()
    try:
        await other.queue.consume({"step": steps, "orchestrator": probes})
        probe = await other.queue.send(orchestrator_message(ids.new_run_id()))
        claimed = await probes.next(BOUND)
        assert claimed.message_id == probe.message_id
        assert not first.lost_lease()
        assert backend.stats.total.restart_releases == 0
        assert steps.calls == []  # the live worker's step stayed with it
    finally:
        held.release.set()
        await other.close()
        await live.close()


async def test_a_survivor_takes_over_once_a_dead_workers_heartbeat_lapses() -> None:
    backend = MemoryBackend(tuning=LONG)
    dead = MemoryWorld(backend, tuning=_as("pod-a"))
    held = Deliveries()
    held.hold = True
    await dead.queue.consume({"step": held})
    sent = await dead.queue.send(step_message())
    first = await held.next()
    survivor = MemoryWorld(backend, tuning=_as("pod-b"))
    taken = Deliveries()
    await survivor.queue.consume({"step": taken})
    try:
        dead.kill()
        second = await taken.next(BOUND)
        assert (second.message_id, second.delivery_count) == (sent.message_id, 2)
        assert first.lost_lease()
        assert backend.stats.total.takeovers == 1
        assert backend.stats.total.restart_releases == 0
    finally:
        held.release.set()
        await survivor.close()


async def test_a_worker_whose_beats_do_not_get_through_loses_its_deliveries() -> None:
    """Its heartbeat writes fail (lost): past its liveness its delivery is told the lease
    is lost (it writes nothing more) and the message is delivered again, long before the
    lease."""
    backend = MemoryBackend(tuning=LONG)
    silent = MemoryWorld(backend, tuning=_as("pod-a"), interceptor=LoseBeats())
    deliveries = Deliveries()
    deliveries.hold = True
    await silent.queue.consume({"step": deliveries})
    try:
        sent = await silent.queue.send(step_message())
        first = await deliveries.next()
        assert first.lease_lost is not None
        await asyncio.wait_for(first.lease_lost.wait(), BOUND)
        second = await deliveries.next(BOUND)
        assert (second.message_id, second.delivery_count) == (sent.message_id, 2)
    finally:
        deliveries.release.set()
        await silent.close()


def test_the_shared_rules() -> None:
    assert liveness.beat_interval(3.0) == 1.0
    assert liveness.beat_interval(0.9) == 0.3
    assert liveness.holder_fresh(10.0, 12.0, 3.0)
    assert not liveness.holder_fresh(10.0, 12.6, 3.0)  # gives up before survivors act
    assert not liveness.lapsed(10.0, 13.0, 3.0) and liveness.lapsed(10.0, 13.01, 3.0)
    assert liveness.worker_id("pod-a") == ("pod-a", True)
    random_id, stable = liveness.worker_id(None)
    assert random_id.startswith("w-") and not stable
