"""Direct tests of ``orchestrator.writer.InBandWriter`` and ``orchestrator.session.RunSession``
against a real World (both), for the writer rules of audit A5, FE7, FE8/EP5, EP8, EP12,
EP13 and EP11 (seed 003 "Event posting edge cases", "Fence edge cases").

Each test makes a run with ``runs.create``, takes the snapshot of a load, and drives
the writer or session the way a delivery would; faults come from ``FaultyEvents``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from treadle import Workflows, errors, settings
from treadle.orchestrator.session import RunSession
from treadle.orchestrator.writer import (
    UNKNOWN_OUTCOME_TRIES,
    InBandWriter,
    Superseded,
    WriterStopped,
)
from treadle.world import events, logcheck

from .conftest import OpenWorld
from .faults import FaultyWorld


async def _run(world: Any) -> tuple[str, events.Snapshot]:
    record = await world.runs.create(
        workflow_name="flow", input=None, deployment_id="local", spec_version=9
    )
    page = await world.events.list(record.run_id)
    return record.run_id, page.snapshot


def _created(step: str) -> events.StepCreated:
    return events.StepCreated(correlation_id=step, step_name="work")


async def _sound(world: Any, run_id: str) -> list[str]:
    page = await world.events.list(run_id)
    assert logcheck.problems(await world.runs.get(run_id), page.events) == []
    return [e.type for e in page.events]


async def test_a_business_refusal_keeps_the_count_and_the_writer_going(
    faulty: FaultyWorld,
) -> None:
    """Audit A5 and FE7 / seed 003 "Non-fence refusal: count stays": a step_started after
    the step's outcome is refused (StepAlreadyEnded); the writer is not stopped, its count
    stands, and the next write at that count commits."""
    run_id, snapshot = await _run(faulty)
    writer = InBandWriter(faulty, run_id, snapshot)
    await writer.create(_created("s1"))
    await writer.create(events.StepStarted(correlation_id="s1", step_name="work", attempt=1))
    await writer.create(events.StepCompleted(correlation_id="s1", step_name="work"))
    count = writer.expected
    with pytest.raises(errors.StepAlreadyEnded):
        await writer.create(events.StepStarted(correlation_id="s1", step_name="work", attempt=2))
    assert not writer.stopped and writer.expected == count
    result = await writer.create(_created("s2"))
    assert result.allocated == 1 and writer.expected == count + 1
    assert (await _sound(faulty, run_id))[-1] == "step_created"


async def test_a_fence_refusal_stops_every_later_write_before_the_world(
    faulty: FaultyWorld,
) -> None:
    """Audit A5 / seed 003 "Fence edge cases": two writers from one snapshot; the second
    commits first, so the first one's write is refused (Superseded), and its later writes
    raise Superseded without reaching the World. No hole is left."""
    run_id, snapshot = await _run(faulty)
    slow = InBandWriter(faulty, run_id, snapshot)
    fast = InBandWriter(faulty, run_id, snapshot)
    await fast.create(_created("winner"))
    with pytest.raises(Superseded):
        await slow.create(_created("loser"))
    reached = len(faulty.events.calls)
    for step in ("later-1", "later-2"):
        with pytest.raises(Superseded):
            await slow.create(_created(step))
    with pytest.raises(Superseded):
        await slow.create_batch([_created("later-3")])
    assert len(faulty.events.calls) == reached, "a write after the refusal reached the World"
    assert await _sound(faulty, run_id) == ["run_created", "step_created"]


async def test_a_storage_failure_stops_the_writer_but_is_not_a_supersession(
    faulty: FaultyWorld,
) -> None:
    """Audit FE8, EP5 and I3 / seed 003 "5xx/transport: writer stops, not superseded": a
    write keeps failing with StorageUnavailable (nothing committed), also when the writer
    sends it again after reading the log (``UNKNOWN_OUTCOME_TRIES``); that write raises
    it, later writes raise WriterStopped (never Superseded) and never reach the World."""
    run_id, snapshot = await _run(faulty)
    writer = InBandWriter(faulty, run_id, snapshot)
    await writer.create(_created("s1"))
    faulty.events.fail_writes(-1)
    with pytest.raises(errors.StorageUnavailable):
        await writer.create(_created("s2"))
    assert writer.stopped and writer.superseded is None
    tried = [kw for t, kw in faulty.events.calls if t == "step_created"][1:]
    assert len(tried) == 1 + UNKNOWN_OUTCOME_TRIES
    assert {kw["expected"] for kw in tried} == {snapshot.seq_in_band + 1}, "the same count"
    reached = len(faulty.events.calls)
    with pytest.raises(WriterStopped):
        await writer.create(_created("s3"))
    assert len(faulty.events.calls) == reached
    assert await _sound(faulty, run_id) == ["run_created", "step_created"]


async def test_a_write_whose_outcome_is_unknown_is_found_committed_or_written_again(
    faulty: FaultyWorld,
) -> None:
    """Simulation seeds 895 and 2716: a write raises StorageUnavailable once with nothing
    committed, and a write and a batch raise after they committed. The writer reads the
    log above each: the first is not there and is written again at the same count; the
    others are there and are answered from the log, not written twice. None stops the
    writer, and its count follows the log."""
    run_id, snapshot = await _run(faulty)
    writer = InBandWriter(faulty, run_id, snapshot)
    faulty.events.fail_writes(1)
    lost = await writer.create(_created("s1"))
    faulty.events.fail_after_writes(2)
    found = await writer.create(_created("s2"))
    batch = await writer.create_batch([_created("b1"), _created("b2")])
    assert not writer.stopped
    assert (lost.event.slot, found.event.slot) == (2, 3)
    assert [item.event.slot for item in batch.items if item.event is not None] == [4, 5]
    assert batch.allocated == 2 and writer.expected == snapshot.seq_in_band + 4
    assert [t for t, _ in faulty.events.calls] == ["step_created"] * 4, "s1 twice, s2 once"
    await writer.create(_created("s3"))
    assert await _sound(faulty, run_id) == ["run_created"] + ["step_created"] * 5


async def test_an_unknown_outcome_with_another_writers_event_above_it_is_a_supersession(
    faulty: FaultyWorld,
) -> None:
    """A write raises StorageUnavailable with nothing committed, and another writer from
    the same snapshot wrote in-band first: reading the log finds that writer's event,
    not its own, so the writer stops as superseded without sending the write again."""
    run_id, snapshot = await _run(faulty)
    slow = InBandWriter(faulty, run_id, snapshot)
    fast = InBandWriter(faulty, run_id, snapshot)
    faulty.events.fail_writes(1, when=lambda e: e.correlation_id == "loser")
    await fast.create(_created("winner"))
    with pytest.raises(Superseded):
        await slow.create(_created("loser"))
    assert slow.superseded is not None
    assert len([c for c in faulty.events.calls if c[0] == "step_created"]) == 2
    assert await _sound(faulty, run_id) == ["run_created", "step_created"]


async def test_queued_writes_name_the_highest_slot_held_and_the_running_count(
    faulty: FaultyWorld,
) -> None:
    """Audit EP12 / seed 003 "Queued writes name the highest known slot": each write carries
    event_count = the highest slot the writer holds (advanced by its own commits and by
    hold_through) and expected_seq_in_band = the snapshot's count plus what it allocated;
    writes queued with create_soon go in the order asked."""
    run_id, snapshot = await _run(faulty)
    writer = InBandWriter(faulty, run_id, snapshot)
    first = await writer.create(_created("s1"))
    await faulty.events.create(
        run_id, events.StepCreated(correlation_id="oob", step_name="work"), in_band=False
    )
    queued = [writer.create_soon(_created(f"q{i}")) for i in range(3)]
    for task in queued:
        await task
    kwargs = [kw for _, kw in faulty.events.calls if kw.get("in_band")]
    assert kwargs[0]["event_count"] == snapshot.seq
    assert kwargs[0]["expected_seq_in_band"] == snapshot.seq_in_band
    # The out-of-band event (slot 3) is not held: the next write still names slot 2.
    assert kwargs[1]["event_count"] == first.event.slot
    assert [kw["expected_seq_in_band"] for kw in kwargs[1:]] == [
        snapshot.seq_in_band + 1 + i for i in range(3)
    ]
    order = [(await t).event.correlation_id for t in queued]
    assert order == ["q0", "q1", "q2"]
    slots = [(await t).event.slot for t in queued]
    assert slots == sorted(slots)
    other = await faulty.events.create(
        run_id, events.StepCreated(correlation_id="oob2", step_name="work"), in_band=False
    )
    writer.hold_through(other.event.slot)  # the delivery consumed it (from the feed, say)
    await writer.create(_created("s9"))
    assert faulty.events.calls[-1][1]["event_count"] == other.event.slot


def _session(world: Any, run_id: str) -> RunSession:
    app = Workflows(world=world, settings_=settings.load({}), worker=False)
    return RunSession(app.runtime(world), run_id)


async def test_an_own_write_above_an_unheld_gap_is_consumed_after_the_gap(
    faulty: FaultyWorld,
) -> None:
    """Audit EP11 and EP13 and G2 (the report path) / seed 003 "Own write above an
    unreported gap", "Feed echo": an out-of-band event lands between the load and an own
    write. The write's skipped-slot report names it, so the session consumes both in slot
    order; the feed's echo of the own write is taken once."""
    run_id, _ = await _run(faulty)
    session = _session(faulty, run_id)
    await session.load()
    await faulty.events.create(
        run_id, events.StepCreated(correlation_id="oob", step_name="work"), in_band=False
    )
    own = await session.write(_created("mine"))
    assert own.slot == 3
    assert [e.correlation_id for e in session.loaded[1:]] == ["oob", "mine"]
    assert session.tail == 3 and not session.has_pending
    session.offer([own])  # the live feed's echo of our own write
    assert session.tail == 3 and len(session.loaded) == 3
    session.close()


async def test_an_event_above_a_gap_waits_for_the_gap_before_it_is_consumed(
    faulty: FaultyWorld,
) -> None:
    """Audit EP11 and G3 / seed 003 "Events not yet consumed": an event offered above a slot
    the session does not hold stays pending (not consumed); a tail read fills the gap and
    then both are consumed in order."""
    run_id, _ = await _run(faulty)
    session = _session(faulty, run_id)
    await session.load()
    for step in ("a", "b"):
        await faulty.events.create(
            run_id, events.StepCreated(correlation_id=step, step_name="work"), in_band=False
        )
    page = await faulty.events.list(run_id, after_slot=2)
    session.offer(page.events)  # slot 3 only: slot 2 is missing
    assert session.tail == 1 and session.has_pending
    assert await session.read_tail()
    assert session.tail == 3 and not session.has_pending
    assert [e.correlation_id for e in session.loaded[1:]] == ["a", "b"]
    session.close()


async def test_a_load_below_the_snapshots_seq_is_a_contract_error(
    open_world: OpenWorld,
) -> None:
    """Audit EP8 / seed 003 "Non-empty log without a snapshot": a World whose full load
    returns fewer events than its snapshot's seq is refused with WorldContractError, never
    replayed from a short log."""
    world = FaultyWorld(await open_world())
    try:
        run_id, _ = await _run(world)
        await world.events.create(run_id, _created("s1"), in_band=False)
        inner_list = world.events.list

        async def short(run_id: str, **kw: Any) -> Any:
            page = await inner_list(run_id, **kw)
            return dataclasses.replace(page, events=page.events[:-1])

        world.events.list = short  # type: ignore[method-assign]
        session = _session(world, run_id)
        with pytest.raises(errors.WorldContractError):
            await session.load()
        session.close()
    finally:
        await world.close()


async def test_an_incomplete_report_makes_the_session_read_the_tail(
    faulty: FaultyWorld,
) -> None:
    """Audit EP10 and G3 / seed 003 "Report incomplete -> reload": more out-of-band events
    land between the load and an own write than a skipped-slot report holds (1,000); the
    write's report says has_more, so the session reads the tail and consumes every event,
    the own write in its slot, in order and without a gap."""
    run_id, _ = await _run(faulty)
    session = _session(faulty, run_id)
    await session.load()
    landed = 1_050
    for start in range(0, landed, 50):
        await faulty.events.create_batch(
            run_id,
            [
                events.StepCreated(correlation_id=f"oob{i}", step_name="work")
                for i in range(start, min(start + 50, landed))
            ],
            in_band=False,
        )
    inner = faulty.events.create
    reports: list[tuple[int, bool]] = []

    async def create(run_id: str, event: events.Event, **kw: Any) -> Any:
        result = await inner(run_id, event, **kw)
        reports.append((len(result.report), result.has_more))
        return result

    faulty.events.create = create  # type: ignore[method-assign]
    own = await session.write(_created("mine"))
    assert reports == [(1_000, True)], "the World's report was cut short (the path under test)"
    assert own.slot == landed + 2
    assert session.tail == own.slot and not session.has_pending
    assert [e.slot for e in session.loaded] == list(range(1, own.slot + 1))
    session.close()
