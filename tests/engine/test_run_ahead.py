"""Run-ahead on spec 9 runs (issue 15 item 1; seed 003 "Run-ahead", "Run-ahead and turbo
edge cases"; ``treadle.orchestrator.runahead``).

Each test runs on both real Worlds (local, and Postgres + NATS) through
``faults.FaultyWorld``, which counts the World calls and injects what a test arms.
Every World treadle has implements ``create_batch`` (the World contract requires it),
so the seed's "World without createBatch" edge case has no World to run on here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter
from typing import Any

import pytest

from treadle import Workflows, errors, sleep, step_metadata
from treadle.orchestrator import runahead
from treadle.world import events, records

from .conftest import MakeApp
from .faults import FaultyWorld

STEPS = 6


def _shape(log: list[events.LoggedEvent]) -> list[tuple[Any, ...]]:
    """The log without its run's ids and times: what run-ahead must leave unchanged."""
    return [
        (
            e.slot,
            e.event.type,
            getattr(e.event, "step_name", None),
            getattr(e.event, "attempt", None),
            getattr(e.event, "result", None),
        )
        for e in log
    ]


def _is_start(event: events.Event, position: int) -> bool:
    return isinstance(event, events.StepStarted) and event.position == position


def _stats() -> dict[str, int]:
    return dataclasses.asdict(runahead.STATS)


def _delta(before: dict[str, int]) -> dict[str, int]:
    return {k: v - before[k] for k, v in _stats().items() if v != before[k]}


def _writes(world: FaultyWorld) -> int:
    return sum(1 for _kind, kw in world.events.calls if kw.get("in_band"))


def _each_outcome_follows_its_start(log: list[events.LoggedEvent]) -> None:
    started: set[str] = set()
    outcomes: Counter[str] = Counter()
    for e in log:
        cid = e.event.correlation_id or ""
        if isinstance(e.event, events.StepStarted | events.StepCreated):
            started.add(cid)
        if isinstance(e.event, events.StepCompleted | events.StepFailed):
            assert cid in started, f"an outcome without its creation at slot {e.slot}"
            outcomes[cid] += 1
    assert all(n == 1 for n in outcomes.values()), outcomes


class _Pipeline:
    """Six sequential inline steps; ``during(n)`` runs inside step n's body."""

    def __init__(self, app: Workflows, during: Any = None) -> None:
        self.ran: Counter[int] = Counter()
        ran, hook = self.ran, during

        @app.step
        async def add(x: int, n: int) -> int:
            ran[n] += 1
            if hook is not None:
                await hook(n)
            return x + n

        @app.workflow
        async def pipeline(x: int) -> int:
            for n in range(STEPS):
                x = await add(x, n)
            return x

        self.workflow = pipeline


async def _run_pipeline(app: Workflows, during: Any = None) -> tuple[_Pipeline, Any]:
    pipe = _Pipeline(app, during)
    run = await app.start(pipe.workflow, 0)
    return pipe, run


async def test_a_clean_run_ahead_leaves_the_log_as_without_it_in_fewer_writes(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """The same sequential pipeline with run-ahead off and at depth 10: the same log
    (slots, types, steps, attempts, results), each body once, no stop or repair, and a
    step's outcome and the next start in one write, so fewer in-band writes."""
    shapes, writes = [], []
    before = _stats()
    for depth in (0, 10):
        app = make_app(world=faulty, WORKFLOW_RUN_AHEAD_DEPTH=depth)
        first = _writes(faulty)
        pipe, run = await _run_pipeline(app)
        assert await run.result(timeout=30) == sum(range(STEPS))
        writes.append(_writes(faulty) - first)
        shapes.append(_shape(await run.events()))
        assert pipe.ran == Counter(range(STEPS)), "each body ran once"
        await app.close(grace_seconds=2)
    assert shapes[0] == shapes[1]
    # Off: run_started, a start and an outcome per step, run_completed. On: an outcome
    # and the next start in one write at most (what joins a write in flight goes with
    # the next one), so at most run_started, the first start, one per step, the end.
    assert writes[0] == 2 * STEPS + 2, writes
    assert writes[1] <= STEPS + 3, writes
    delta = _delta(before)
    assert delta.get("groups", 0) >= 1 and "stops" not in delta and "repairs" not in delta


async def test_a_world_that_stores_its_own_time_stops_run_ahead_for_that_world(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 003 "World stores its own time": a speculative write stored at a time other
    than the occurred_at the workflow used stops the delivery, which restarts in place
    and completes; run-ahead stays off for that World (a second run runs none ahead)."""
    inner = faulty.events.create_batch

    async def own_time(run_id: str, batch: Any, **kw: Any) -> records.BatchResult:
        kw["occurred_at"] = None  # the World's clock, not the workflow's
        return await inner(run_id, batch, **kw)

    faulty.events.create_batch = own_time  # type: ignore[method-assign]
    app = make_app(world=faulty)
    before = _stats()
    try:
        pipe, run = await _run_pipeline(app)
        assert await run.result(timeout=30) == sum(range(STEPS))
        delta = _delta(before)
        assert delta.get("stops") == 1 and delta.get("restarts") == 1, delta
        _each_outcome_follows_its_start(await run.events())
        groups = _stats()["groups"]
        run2 = await app.start(pipe.workflow, 0)
        assert await run2.result(timeout=30) == sum(range(STEPS))
        assert _stats()["groups"] == groups, "run-ahead stays off for this World"
    finally:
        runahead._off_for_worlds.discard(id(faulty))


async def test_at_the_depth_cap_an_outcome_waits_for_an_earlier_write(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 003 "Depth cap": with WORKFLOW_RUN_AHEAD_DEPTH=1 and three inline siblings
    finishing together, no write carries more than one unconfirmed outcome, each later
    outcome runs ahead once the earlier write settled, and the run completes."""
    app = make_app(world=faulty, WORKFLOW_RUN_AHEAD_DEPTH=1, WORKFLOW_MAX_INLINE_STEPS=3)
    ran: Counter[int] = Counter()

    @app.step
    async def one(n: int) -> int:
        ran[n] += 1
        return n

    @app.workflow
    async def fan() -> list[int]:
        first = await one(0)
        return [first, *await asyncio.gather(one(1), one(2), one(3))]

    batches: list[list[str]] = []
    inner = faulty.events.create_batch

    async def recorded(run_id: str, batch: Any, **kw: Any) -> records.BatchResult:
        batches.append([e.type for e in batch])
        return await inner(run_id, batch, **kw)

    faulty.events.create_batch = recorded  # type: ignore[method-assign]
    run = await app.start(fan)
    assert await run.result(timeout=30) == [0, 1, 2, 3]
    assert ran == Counter(range(4))
    assert batches and all(b.count("step_completed") <= 1 for b in batches), batches
    _each_outcome_follows_its_start(await run.events())


async def test_a_displaced_speculative_write_is_repaired_not_stopped(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 003 "Displaced speculative write": another writer's harmless event (a
    ``wake_requested``, out-of-band) takes the slot run-ahead predicted; the delivery
    repairs (reloads and replays) without a stop, and the run completes, each body once."""
    app = make_app(world=faulty)
    inner = faulty.events.create_batch
    appended = []

    async def displaced(run_id: str, batch: Any, **kw: Any) -> records.BatchResult:
        if not appended and any(isinstance(e, events.StepCompleted) for e in batch):
            # An outcome ran ahead: another writer takes the slot it predicted.
            woken = events.WakeRequested()
            appended.append(await faulty.inner.events.create(run_id, woken, in_band=False))
        return await inner(run_id, batch, **kw)

    faulty.events.create_batch = displaced  # type: ignore[method-assign]
    before = _stats()
    pipe, run = await _run_pipeline(app)
    assert await run.result(timeout=30) == sum(range(STEPS))
    assert pipe.ran == Counter(range(STEPS))
    delta = _delta(before)
    assert delta.get("repairs", 0) >= 1 and "stops" not in delta, delta
    log = await run.events()
    assert [e.type for e in log].count("wake_requested") == 1
    _each_outcome_follows_its_start(log)


async def test_a_cancellation_below_a_speculative_write_leaves_no_outcome_without_creation(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 003 "Cancellation below a speculative write": a cancel lands while step 2
    runs; it is not a hazard, the next speculative start is refused by the ended run,
    and the log holds no outcome without its creation and nothing started after the
    cancel."""
    app = make_app(world=faulty)

    async def during(n: int) -> None:
        if n == 2:
            await app.get_run(step_metadata().run_id).cancel("out of band")

    pipe, run = await _run_pipeline(app, during)
    with pytest.raises(Exception, match="cancel"):
        await run.result(timeout=30)
    log = await run.events()
    _each_outcome_follows_its_start(log)
    types = [e.type for e in log]
    cancelled = types.index("run_cancelled")
    assert "step_started" not in types[cancelled:], types
    assert max(pipe.ran.values()) == 1


async def test_a_refused_speculative_creation_stops_and_the_restart_runs_its_body_again(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 003 "Refused speculative creation" and "Step bodies a run-ahead stop can run
    twice": the World refuses step 3's speculative start; no later write goes out but the
    outcomes of committed starts, the delivery restarts in place, and the restarted pass
    runs step 3 again: the one documented double run (counted), the run completes, the
    log as a clean run's. Bodies of later steps that ran ahead before the refusal came
    back (their starts dropped by the stop) are run again too: at most the depth."""
    inner = faulty.events.create_batch
    refused = []

    async def refusing(run_id: str, batch: Any, **kw: Any) -> records.BatchResult:
        at = next((i for i, e in enumerate(batch) if _is_start(e, 3)), None)
        if refused or at is None:
            return await inner(run_id, batch, **kw)
        # Step 3's start and every later item refused, as a World refuses an ended run's.
        refused.append(batch[at])
        head = await inner(run_id, batch[:at], **kw) if at else None
        no = records.BatchItemResult(error=errors.RunExpired(run_id, status="x", event_type="y"))
        items = (*(head.items if head else ()), *(no for _ in batch[at:]))
        if head is None:
            return records.BatchResult(items=items, allocated=0)
        return dataclasses.replace(head, items=items)

    faulty.events.create_batch = refusing  # type: ignore[method-assign]
    app = make_app(world=faulty)
    before = _stats()
    pipe, run = await _run_pipeline(app)
    assert await run.result(timeout=30) == sum(range(STEPS))
    delta = _delta(before)
    assert delta.get("restarts") == 1, delta
    at_risk = delta.get("bodies_at_risk", 0)
    assert 1 <= at_risk <= 10, delta  # WORKFLOW_RUN_AHEAD_DEPTH
    assert pipe.ran[3] == 2, "the refused start's body ran, and ran again after the restart"
    assert all(pipe.ran[n] == 1 for n in range(3))
    assert sum(pipe.ran.values()) - STEPS == at_risk, (pipe.ran, delta)
    log = await run.events()
    _each_outcome_follows_its_start(log)
    assert [e.type for e in log].count("step_started") == STEPS


async def test_a_fence_refusal_while_running_ahead_redelivers_and_completes(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 003 "Fence refusal while running ahead": the fence refuses a speculative
    write; it is handled as any refusal (a redelivery in about a second), nothing it
    carried is written, and the redelivery completes the run."""
    inner = faulty.events.create_batch
    refused = []

    async def fenced(run_id: str, batch: Any, **kw: Any) -> records.BatchResult:
        if not refused and any(isinstance(e, events.StepCompleted) for e in batch):
            refused.append(batch)  # the first write carrying an outcome run ahead
            expected = kw["expected_seq_in_band"]
            raise errors.InBandSuperseded(
                run_id, expected_seq_in_band=expected, seq_in_band=expected + 1
            )
        return await inner(run_id, batch, **kw)

    faulty.events.create_batch = fenced  # type: ignore[method-assign]
    app = make_app(world=faulty)
    pipe, run = await _run_pipeline(app)
    assert await run.result(timeout=30) == sum(range(STEPS))
    answers = [a.result for a in faulty.queue.orchestrator_answers()]
    assert any(type(a).__name__ == "Redeliver" for a in answers), answers
    log = await run.events()
    _each_outcome_follows_its_start(log)
    assert sorted(pipe.ran) == list(range(STEPS))


async def test_siblings_started_ahead_are_judged_after_the_drain(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 003 "Slot gap from a queued sibling start": siblings' starts and outcomes go
    out ahead in several writes; the delivery drains before it reads the log, so no
    sibling's queued start is taken for a hole: the run completes with every step once,
    without a repair or a stop."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=4)
    ran: Counter[int] = Counter()

    @app.step
    async def wait_a_bit(n: int) -> int:
        ran[n] += 1
        await asyncio.sleep(0.01 * (n % 3))
        return n

    @app.workflow
    async def siblings() -> list[int]:
        out = [await wait_a_bit(0)]
        out += await asyncio.gather(*(wait_a_bit(n) for n in range(1, 5)))
        out.append(await wait_a_bit(5))
        return out

    before = _stats()
    run = await app.start(siblings)
    assert await run.result(timeout=30) == list(range(6))
    assert ran == Counter(range(6))
    delta = _delta(before)
    assert "stops" not in delta and "repairs" not in delta, delta
    _each_outcome_follows_its_start(await run.events())


async def test_a_hazard_appended_out_of_band_stops_and_the_restart_completes_the_run(
    make_app: MakeApp, faulty: FaultyWorld, caplog: pytest.LogCaptureFixture
) -> None:
    """Seed 003 "Hazards", "A hazard stop and the restart in place": a ``wait_completed``
    (always a hazard: only the orchestrator completes waits) appended directly just
    before the first speculative outcome is written is found in that write's report. The
    delivery stops, logs it at error level with possible_log_corruption, restarts in
    place (fresh writer, full load, cold replay, run-ahead off) and completes the run
    from the log: the wait reads as completed, every step's outcome once."""
    app = make_app(world=faulty)
    ran: Counter[int] = Counter()

    @app.step
    async def add(x: int, n: int) -> int:
        ran[n] += 1
        return x + n

    inner = faulty.events.create_batch
    appended = []

    async def hazard_first(run_id: str, batch: Any, **kw: Any) -> records.BatchResult:
        if not appended and any(isinstance(e, events.StepCompleted) for e in batch):
            # An outcome ran ahead: another writer completes the wait below it.
            page = await faulty.inner.events.list(run_id)
            wait = next(e for e in page.events if isinstance(e.event, events.WaitCreated))
            done = events.WaitCompleted(correlation_id=wait.event.correlation_id)
            appended.append(await faulty.inner.events.create(run_id, done, in_band=False))
        return await inner(run_id, batch, **kw)

    faulty.events.create_batch = hazard_first  # type: ignore[method-assign]

    @app.workflow
    async def raced() -> list[Any]:
        timer = asyncio.ensure_future(sleep(3600))  # far off: the boundaries stay inert
        x = 0
        for n in range(STEPS):
            x = await add(x, n)
        return [x, timer.done()]

    before = _stats()
    with caplog.at_level(logging.ERROR, logger="treadle.orchestrator.runahead"):
        run = await app.start(raced)
        assert await run.result(timeout=30) == [sum(range(STEPS)), True]
    delta = _delta(before)
    assert delta.get("stops") == 1 and delta.get("restarts") == 1, delta
    stops = [r for r in caplog.records if getattr(r, "possible_log_corruption", False)]
    assert stops and stops[0].levelno == logging.ERROR and run.run_id in stops[0].getMessage()
    log = await run.events()
    _each_outcome_follows_its_start(log)
    assert [e.type for e in log].count("wait_completed") == 1
    assert set(ran) == set(range(STEPS))


async def test_a_max_retries_0_body_never_starts_ahead_of_its_start(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 003 "maxRetries: 0 is at most once per live owner": run-ahead writes a
    ``max_retries=0`` step's start ahead with the previous outcome, but its body starts
    only once that start committed: the body finds its own start in the log."""
    app = make_app(world=faulty)
    seen: list[bool] = []

    @app.step
    async def warm(n: int) -> int:
        return n

    @app.step(max_retries=0)
    async def once(n: int) -> int:
        meta = step_metadata()
        page = await faulty.inner.events.list(meta.run_id)
        seen.append(any(e.event.correlation_id == meta.step_id for e in page.events))
        return n

    @app.workflow
    async def flow() -> int:
        total = 0
        for n in range(3):
            total += await warm(n) + await once(n)
        return total

    before = _stats()
    run = await app.start(flow)
    assert await run.result(timeout=30) == 6
    assert seen == [True, True, True]
    assert _delta(before).get("groups", 0) >= 1, "the run ran ahead"
    _each_outcome_follows_its_start(await run.events())


async def test_a_full_group_goes_out_on_its_own_and_the_next_opens(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """A speculative group holds at most 16 events (seed 003): sixteen inline siblings
    run ahead at depth 16 fill groups that go out as they fill, and the run completes,
    no write longer than 16 events."""
    app = make_app(world=faulty, WORKFLOW_RUN_AHEAD_DEPTH=16, WORKFLOW_MAX_INLINE_STEPS=16)

    @app.step
    async def one(n: int) -> int:
        return n

    @app.workflow
    async def wide() -> int:
        first = await one(0)
        return first + sum(await asyncio.gather(*(one(n) for n in range(16)))) + await one(1)

    sizes: list[int] = []
    inner = faulty.events.create_batch

    async def recorded(run_id: str, batch: Any, **kw: Any) -> records.BatchResult:
        sizes.append(len(batch))
        return await inner(run_id, batch, **kw)

    faulty.events.create_batch = recorded  # type: ignore[method-assign]
    before = _stats()
    run = await app.start(wide)
    assert await run.result(timeout=30) == sum(range(16)) + 1
    assert sizes and max(sizes) <= runahead.MAX_SPECULATIVE_BATCH_EVENTS, sizes
    assert _delta(before).get("groups", 0) >= 2
    _each_outcome_follows_its_start(await run.events())
