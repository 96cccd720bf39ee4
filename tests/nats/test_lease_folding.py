"""Sends to a held run from one process fold into few compare-and-sets on its lease.

A fan-out's completion wakes each folded themselves into the running orchestrator
delivery's lease with a compare-and-set, racing each other; concurrent folds of one
run now join the one in flight, and every fold is still counted on the holder
before its send returns.
"""

from __future__ import annotations

import asyncio

import pytest

from treadle.worlds.nats import leases

from .conftest import NatsHarness

KEY = "wrun_folding_test"


async def test_concurrent_folds_are_all_counted_with_few_writes(
    harness: NatsHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = await harness.connect()
    try:
        run_leases = queue.leases
        taken = await run_leases.take(KEY, "holder")
        assert isinstance(taken, leases.Held)
        writes: list[bool] = []
        write = run_leases._write

        async def counted(*args: object) -> bool:
            won = await write(*args)  # type: ignore[arg-type]
            writes.append(won)
            return won

        monkeypatch.setattr(run_leases, "_write", counted)
        folded = await asyncio.gather(*(run_leases.coalesce(KEY) for _ in range(40)))
        assert folded == [True] * 40
        assert await run_leases.finish(KEY, taken.token, covered=0) == leases.Rerun(40)
        assert len(writes) <= 4, writes  # one per fold in flight, not one race per send
    finally:
        await queue.close()


async def test_folds_without_a_holder_all_send(harness: NatsHarness) -> None:
    queue = await harness.connect()
    try:
        folded = await asyncio.gather(*(queue.leases.coalesce(KEY) for _ in range(10)))
        assert folded == [False] * 10
    finally:
        await queue.close()
