"""A worker's per-run memory stays bounded however many runs it serves (issue 15 item 5:
"no growth that is not bounded: ``Runtime.consumed`` and similar caches are capped").

5,000 one-step runs on the local World through one in-process worker whose
``Runtime.consumed`` is capped at 200 runs: afterwards it holds at most 200 runs, the
most recent among them, and no other per-run structure of the runtime outgrew its cap.
Sizes are asserted, never time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from treadle import Workflows, settings
from treadle.orchestrator import runtime
from treadle.worlds.local import LocalWorld

RUNS = 5_000
CAP = 200
BATCH = 250


def test_consumed_slots_keep_the_most_recent_runs_only() -> None:
    slots = runtime.ConsumedSlots(limit=3)
    for i in range(10):
        slots[f"wrun_{i}"] = i
    assert len(slots) == 3
    assert [slots.get(f"wrun_{i}") for i in range(7, 10)] == [7, 8, 9]
    assert slots.get("wrun_0") is None
    slots.get("wrun_7")  # a read keeps a run: the next one pushed out is wrun_8
    slots["wrun_10"] = 10
    assert "wrun_7" in slots and "wrun_8" not in slots
    slots.forget("wrun_7")
    assert "wrun_7" not in slots
    with pytest.raises(ValueError, match="at least 1"):
        runtime.ConsumedSlots(limit=0)


async def test_many_runs_leave_the_runtime_caches_at_their_caps(tmp_path: Path) -> None:
    app = Workflows(
        world=await LocalWorld(tmp_path / "world").open(),
        settings_=settings.load({}, WORKFLOW_ORCHESTRATOR_LINGER_MS=0),
        worker=True,
    )

    @app.step
    async def double(x: int) -> int:
        return 2 * x

    @app.workflow
    async def one_step(x: int) -> int:
        return await double(x)

    try:
        await app.world()
        worker = app._worker
        assert worker is not None
        rt = worker.rt
        rt.consumed = runtime.ConsumedSlots(limit=CAP)
        last = None
        for start in range(0, RUNS, BATCH):
            runs = [await app.start(one_step, i) for i in range(start, start + BATCH)]
            results = await asyncio.gather(*(r.result(timeout=120) for r in runs))
            assert results == [2 * i for i in range(start, start + BATCH)]
            assert len(rt.consumed) <= CAP
            last = runs[-1]
        assert last is not None
        assert len(rt.consumed) == CAP  # full, not emptied: the fast path still works
        assert last.run_id in rt.consumed
        assert len(rt.near_due_sent._keys) <= rt.near_due_sent._limit
        assert len(rt.resent_invocations._keys) <= rt.resent_invocations._limit
        assert not rt.single_flight.running(last.run_id, "any")
        assert rt.single_flight._running == {}
    finally:
        await app.close(grace_seconds=2)
