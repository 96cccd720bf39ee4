"""Entity reads: ``events.list_entity``, one step's (wait's, hook's) events by correlation id.

What a background step's delivery reads instead of the run's whole log (seed 003
follow-up 3): the events ``events.list`` holds of that correlation id, in slot
order, paged by the same cursor rules, with the run's snapshot, and nothing else.
A World's test module subclasses ``EntityReadConformance`` beside the storage suite.
"""

from __future__ import annotations

import pytest

from treadle import errors
from treadle.world import contract, events, ids
from treadle.world.conformance.harness import WorldHarness
from treadle.world.conformance.support import (
    BOOM,
    attr,
    full_log,
    in_band,
    inline_start,
    opened,
    out_of_band,
    started_run,
    step_completed,
    step_created,
    stored,
    wait_created,
)


async def _entity_log(
    world: contract.World, run_id: str, correlation_id: str, *, limit: int
) -> list[events.LoggedEvent]:
    out: list[events.LoggedEvent] = []
    after = 0
    for _ in range(1000):
        page = await world.events.list_entity(run_id, correlation_id, after_slot=after, limit=limit)
        assert page.cursor == (page.events[-1].slot if page.events else after)
        out.extend(page.events)
        if not page.has_more:
            return out
        after = page.cursor
    raise AssertionError("events.list_entity never reached has_more=False")


class EntityReadConformance:
    """``events.list_entity``; subclass it as ``Test...`` with a ``harness`` fixture."""

    async def test_lists_only_the_entitys_events_in_slot_order(self, harness: WorldHarness) -> None:
        """Interleaved with other steps, waits and run events, a step's events come back
        alone, in slot order, exactly as the full listing holds them."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            mine, other = "step_mine", "step_other"
            await in_band(world, run_id, step_created(mine))
            await in_band(world, run_id, inline_start(other))
            await in_band(world, run_id, attr("a"))
            await in_band(world, run_id, wait_created("wait_1"))
            await out_of_band(
                world, run_id, events.StepStarted(correlation_id=mine, step_name="fetch", attempt=1)
            )
            await out_of_band(
                world,
                run_id,
                events.StepRetrying(correlation_id=mine, step_name="fetch", attempt=1, error=BOOM),
            )
            await out_of_band(world, run_id, step_completed(other))
            await out_of_band(
                world, run_id, events.StepStarted(correlation_id=mine, step_name="fetch", attempt=2)
            )
            await out_of_band(world, run_id, step_completed(mine, "fetch"))
            whole = await full_log(world, run_id)
            page = await world.events.list_entity(run_id, mine)
            expected = [stored(e) for e in whole if e.correlation_id == mine]
            assert [stored(e) for e in page.events] == expected
            assert [e.type for e in page.events] == [
                "step_created",
                "step_started",
                "step_retrying",
                "step_started",
                "step_completed",
            ]
            assert not page.has_more
            assert page.cursor == page.events[-1].slot
            assert page.snapshot.seq == whole[-1].slot
            assert [e.event_id for e in page.events] == [
                ids.event_id(e.slot) for e in whole if e.correlation_id == mine
            ]

    async def test_pages_by_cursor_and_after_slot(self, harness: WorldHarness) -> None:
        """``limit`` and ``after_slot`` page the entity's events as ``list`` pages the log."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            sid = "step_paged"
            await in_band(world, run_id, step_created(sid))
            for attempt in range(1, 6):
                await in_band(world, run_id, attr(f"noise{attempt}"))
                await out_of_band(
                    world,
                    run_id,
                    events.StepStarted(correlation_id=sid, step_name="fetch", attempt=attempt),
                )
            whole = [e for e in await full_log(world, run_id) if e.correlation_id == sid]
            assert len(whole) == 6
            paged = await _entity_log(world, run_id, sid, limit=2)
            assert [stored(e) for e in paged] == [stored(e) for e in whole]
            later = await world.events.list_entity(run_id, sid, after_slot=whole[2].slot)
            assert [e.slot for e in later.events] == [e.slot for e in whole[3:]]

    async def test_unknown_entity_is_an_empty_page_unknown_run_is_run_not_found(
        self, harness: WorldHarness
    ) -> None:
        async with opened(harness) as world:
            run_id = await started_run(world)
            page = await world.events.list_entity(run_id, "step_never", after_slot=0)
            assert (page.events, page.has_more, page.cursor) == ((), False, 0)
            assert page.snapshot.seq == 2
            with pytest.raises(errors.RunNotFound):
                await world.events.list_entity("wrun_01HZZZZZZZZZZZZZZZZZZZZZZZ", "step_x")

    async def test_bounds_are_those_of_list(self, harness: WorldHarness) -> None:
        async with opened(harness) as world:
            run_id = await started_run(world)
            with pytest.raises(errors.WorldContractError):
                await world.events.list_entity(run_id, "step_x", limit=0)
            with pytest.raises(errors.WorldContractError):
                await world.events.list_entity(run_id, "step_x", after_slot=-1)
