"""Attributes under turbo's optimistic start (issue 17 item 2; seed 003 "Every write still
lands after ``run_started``", "When ``run_started`` or a later write is refused",
"Attributes seeded at ``start()`` survive the skipped event load").

An early inline body's ``set_attributes()`` is an out-of-band write made outside the
in-band writer, so it waits on the delivery's run-ready barrier (``run_started``
committed); a refused ``run_started`` fails it, and no attribute lands on a run whose
log does not record the step that set it. Both real Worlds, through ``FaultyWorld``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from treadle import set_attributes
from treadle.orchestrator import turbo
from treadle.world import events

from .audit import assert_sound
from .conftest import MakeApp
from .faults import CURRENT, FaultyWorld
from .optimistic import HOLD_BOUND_SECONDS, TURBO_ONLY, hold_writes, is_run_started


@pytest.fixture
def barrier_waits(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Set when a write waits on turbo's run-ready barrier (``OptimisticStarts.run_ready``)."""
    waited = asyncio.Event()
    real: Callable[[turbo.OptimisticStarts], Awaitable[None]] = turbo.OptimisticStarts.run_ready

    async def recorded(self: turbo.OptimisticStarts) -> None:
        waited.set()
        await real(self)

    monkeypatch.setattr(turbo.OptimisticStarts, "run_ready", recorded)
    return waited


async def test_an_early_bodys_attributes_wait_for_run_started(
    make_app: MakeApp, faulty: FaultyWorld, barrier_waits: asyncio.Event
) -> None:
    """run_started is held at the World; the early body calls set_attributes(), whose
    write waits on the barrier (the body sees it wait, then lets run_started go). The
    attr_set lands after run_started, before the step's outcome.

    Seen to fail: without the barrier (``attributes.bind_step`` ignoring RUN_READY) the
    body never sees a wait, the hold's bound runs out and the attr_set takes slot 2."""
    gate = hold_writes(faulty, is_run_started)
    app = make_app(world=faulty, **TURBO_ONLY)

    @app.step
    async def tag() -> str:
        pending = set_attributes({"tagged": "early"})
        await asyncio.wait_for(barrier_waits.wait(), HOLD_BOUND_SECONDS)
        gate.release.set()
        await pending
        return "t"

    @app.workflow
    async def flow() -> str:
        return await tag()

    run = await app.start(flow, attributes={"seeded": True})
    assert await run.result(timeout=30) == "t"
    assert gate.timed_out == []
    log = await assert_sound(run)
    kinds = [e.type for e in log]
    started = kinds.index("run_started")
    assert kinds.index("attr_set") > started
    assert kinds.index("attr_set") < kinds.index("step_completed")
    record = await run.get()
    assert record.attributes == {"seeded": True, "tagged": "early"}


async def test_a_refused_run_started_fails_the_early_bodys_attributes(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """The fence refuses turbo's run_started: the early body's set_attributes() raises
    that refusal instead of writing, so no attr_set reaches the World before
    run_started; the redelivery runs the body again, which writes it once."""
    app = make_app(world=faulty, **TURBO_ONLY)
    outcomes: Counter[str] = Counter()

    @app.step
    async def tag() -> str:
        try:
            await set_attributes({"tagged": "yes"})
        except Exception as exc:
            outcomes[type(exc).__name__] += 1
            raise
        outcomes["written"] += 1
        return "t"

    @app.workflow
    async def flow() -> str:
        return await tag()

    faulty.events.refuse_in_band(1, when=is_run_started)
    run = await app.start(flow)
    assert await run.result(timeout=30) == "t"
    assert outcomes == Counter(Superseded=1, written=1)  # the writer's fence refusal
    log = await assert_sound(run)
    started = next(e.slot for e in log if e.type == "run_started")
    sets = [e for e in log if isinstance(e.event, events.AttrSet)]
    assert [e.event.key for e in sets] == ["tagged"]  # type: ignore[union-attr]
    assert sets[0].slot > started


async def test_attributes_seeded_at_start_survive_the_skipped_load(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """start(attributes=) does not turn turbo off (the first delivery skips the log load:
    no orchestrator load from slot 0) and the seeded attributes are in the run's record,
    searchable from the start, beside the workflow's own."""
    loads: list[int] = []
    inner = faulty.events.list

    async def listed(run_id: str, **kw: Any) -> Any:
        current = CURRENT.get()
        if current is not None and current.kind == "orchestrator" and not kw.get("after_slot"):
            loads.append(current.meta.delivery_count)
        return await inner(run_id, **kw)

    faulty.events.list = listed  # type: ignore[method-assign]
    app = make_app(world=faulty, **TURBO_ONLY)

    @app.workflow
    async def flow() -> str:
        set_attributes({"later": 2})
        return "ok"

    run = await app.start(flow, attributes={"customer": "acme"})
    world = await app.world()
    found = await world.runs.list(attributes={"customer": "acme"})
    assert run.run_id in {r.run_id for r in found.runs}
    assert await run.result(timeout=30) == "ok"
    assert 1 not in loads, "the first delivery loaded the log: turbo was off"
    assert (await run.get()).attributes == {"customer": "acme", "later": 2}
