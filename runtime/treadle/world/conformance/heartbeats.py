"""Storage conformance of the step heartbeat store (``contract.Heartbeats``, issue 17
item 5): one row per step holding its latest beat; a beat of an older attempt never
overwrites a newer attempt's; rows outlive a reopen. Subclass ``HeartbeatsConformance``
as ``Test...`` with a ``harness`` fixture; a World without the store fails it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from treadle.world import contract
from treadle.world.conformance import support
from treadle.world.conformance.harness import WorldHarness

AT = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


class HeartbeatsConformance:
    async def test_the_latest_beat_of_the_latest_attempt_is_kept(
        self, harness: WorldHarness
    ) -> None:
        async with support.opened(harness) as world:
            store = contract.heartbeats_of(world)
            assert store is not None, "the World keeps no step heartbeats"
            run = await support.new_run(world)
            step = support.unique("step")
            assert await store.get(run.run_id, step) is None
            await store.record(run.run_id, step, attempt=1, details={"done": 1}, beat_at=AT)
            later = AT + timedelta(seconds=2)
            await store.record(run.run_id, step, attempt=1, details={"done": 2}, beat_at=later)
            held = await store.get(run.run_id, step)
            assert held is not None
            assert (held.attempt, held.details, held.beat_at) == (1, {"done": 2}, later)
            await store.record(run.run_id, step, attempt=2, details=[1, "x"], beat_at=later)
            await store.record(run.run_id, step, attempt=1, details="stale", beat_at=later)
            held = await store.get(run.run_id, step)
            assert held is not None
            assert (held.attempt, held.details) == (2, [1, "x"])
            other = support.unique("step")
            await store.record(run.run_id, other, attempt=1, details=None, beat_at=AT)
            held_other = await store.get(run.run_id, other)
            assert held_other is not None
            assert held_other.details is None
        async with support.opened(harness) as again:
            store = contract.heartbeats_of(again)
            assert store is not None
            held = await store.get(run.run_id, step)
            assert held is not None
            assert held.attempt == 2
