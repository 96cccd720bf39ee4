"""Storage conformance: runs, the log, the in-band fence, reports, batches, terminal runs.

Pins the storage half of the World contract (``treadle.world.contract``, DESIGN.md
3.1, seed 003 "Implementing spec 9 in a World"); ``storage_views`` pins the rest
(hooks, read views, the live feed, restarts) with the helpers defined here. A
World's test module subclasses ``StorageConformance`` and provides a ``harness``
fixture (``harness.WorldHarness``); every test opens its own World and closes it.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from treadle import errors
from treadle.world import constants, events, ids, records
from treadle.world.conformance.harness import WorldHarness
from treadle.world.conformance.support import (
    BOOM,
    DEPLOYMENT,
    ENDINGS,
    OCCURRED_AT,
    SPEC_VERSION,
    attr,
    end_run,
    full_log,
    hook_created,
    in_band,
    inline_start,
    log_and_snapshot,
    new_run,
    opened,
    out_of_band,
    started_run,
    step_completed,
    step_created,
    step_failed,
    stored,
    unique,
    wait_created,
)


class StorageConformance:
    """The storage half of the World contract; subclass it as ``Test...`` with a harness."""

    async def test_world_declares_the_in_band_fence(self, harness: WorldHarness) -> None:
        """A World for spec 9 runs declares the fence (seed 003 "Storage: the in-band fence")."""
        async with opened(harness) as world:
            assert world.capabilities.in_band_fence is True

    async def test_new_run_holds_run_created_at_slot_one(self, harness: WorldHarness) -> None:
        """runs.create writes run_created at slot 1, in-band, with seq 1 and seq_in_band 1."""
        async with opened(harness) as world:
            run = await new_run(world, input={"n": 1})
            assert ids.is_run_id(run.run_id)
            assert (run.status, run.seq, run.seq_in_band) == ("pending", 1, 1)
            assert (run.workflow_name, run.deployment_id) == ("wf", DEPLOYMENT)
            assert (run.spec_version, run.input) == (SPEC_VERSION, {"n": 1})
            assert run.seq_in_band == constants.IN_BAND_SEQ_AT_RUN_CREATION
            assert await world.runs.get(run.run_id) == run
            page = await world.events.list(run.run_id)
            assert page.snapshot == events.Snapshot(seq=1, seq_in_band=1)
            assert [(e.slot, e.in_band, e.type) for e in page.events] == [(1, True, "run_created")]
            created = page.events[0].event
            assert isinstance(created, events.RunCreated)
            assert (created.workflow_name, created.input) == ("wf", {"n": 1})
            assert (created.deployment_id, created.spec_version) == (DEPLOYMENT, SPEC_VERSION)

    async def test_retried_create_with_the_same_run_id_returns_the_same_run(
        self, harness: WorldHarness
    ) -> None:
        """runs.create with an existing run_id, same workflow and input, is a retried start."""
        async with opened(harness) as world:
            run_id = ids.new_run_id()
            first = await new_run(world, run_id=run_id, input={"n": 1})
            again = await new_run(world, run_id=run_id, input={"n": 1})
            assert first.run_id == again.run_id == run_id
            assert (again.seq, again.seq_in_band) == (1, 1)
            assert len(await full_log(world, run_id)) == 1

    async def test_create_with_a_taken_run_id_and_other_input_is_a_contract_error(
        self, harness: WorldHarness
    ) -> None:
        """runs.create with an existing run_id but another input raises WorldContractError."""
        async with opened(harness) as world:
            run_id = ids.new_run_id()
            await new_run(world, run_id=run_id, input={"n": 1})
            with pytest.raises(errors.WorldContractError):
                await new_run(world, run_id=run_id, input={"n": 2})
            assert len(await full_log(world, run_id)) == 1

    async def test_get_of_an_unknown_run_raises_run_not_found(self, harness: WorldHarness) -> None:
        """runs.get of an id the World never created raises RunNotFound."""
        async with opened(harness) as world:
            with pytest.raises(errors.RunNotFound):
                await world.runs.get(ids.new_run_id())

    async def test_in_band_write_at_the_current_count_advances_both_counters(
        self, harness: WorldHarness
    ) -> None:
        """An accepted in-band write takes the next slot and moves seq and seq_in_band."""
        async with opened(harness) as world:
            run = await new_run(world)
            result = await world.events.create(
                run.run_id,
                events.RunStarted(),
                in_band=True,
                expected_seq_in_band=1,
                event_count=1,
            )
            assert result.allocated == 1
            assert (result.event.slot, result.event.in_band) == (2, True)
            assert result.event.type == "run_started"
            assert (result.report, result.has_more) == ((), False)
            after = await world.runs.get(run.run_id)
            assert (after.seq, after.seq_in_band, after.status) == (2, 2, "running")
            assert after.started_at is not None

    async def test_stale_in_band_write_is_refused_and_leaves_no_hole(
        self, harness: WorldHarness
    ) -> None:
        """A stale expected_seq_in_band raises InBandSuperseded and writes nothing."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            before = await log_and_snapshot(world, run_id)
            with pytest.raises(errors.InBandSuperseded) as refused:
                await world.events.create(
                    run_id, attr("late"), in_band=True, expected_seq_in_band=1, event_count=1
                )
            assert refused.value.expected_seq_in_band == 1
            assert refused.value.seq_in_band == 2
            assert await log_and_snapshot(world, run_id) == before

    async def test_concurrent_in_band_writers_at_one_count_exactly_one_wins(
        self, harness: WorldHarness
    ) -> None:
        """Of 20 concurrent in-band writers holding one count, one wins; no slot is lost."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            outcomes = await asyncio.gather(
                *(
                    world.events.create(
                        run_id, attr(f"w{i}"), in_band=True, expected_seq_in_band=2, event_count=2
                    )
                    for i in range(20)
                ),
                return_exceptions=True,
            )
            won = [o for o in outcomes if isinstance(o, records.EventResult)]
            lost = [o for o in outcomes if isinstance(o, errors.InBandSuperseded)]
            assert (len(won), len(lost)) == (1, 19), outcomes
            logged, snapshot = await log_and_snapshot(world, run_id)
            assert snapshot == events.Snapshot(seq=3, seq_in_band=3)
            assert [e.slot for e in logged] == [1, 2, 3]
            assert logged[2].event == won[0].event.event

    async def test_out_of_band_write_moves_seq_only_and_is_never_fenced(
        self, harness: WorldHarness
    ) -> None:
        """An out-of-band write moves seq only; the in-band count it left stays valid."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            result = await out_of_band(world, run_id, attr("outside"))
            assert (result.allocated, result.event.slot, result.event.in_band) == (1, 3, False)
            assert (result.report, result.has_more) == ((), False)
            run = await world.runs.get(run_id)
            assert (run.seq, run.seq_in_band) == (3, 2)
            accepted = await world.events.create(
                run_id, attr("inside"), in_band=True, expected_seq_in_band=2, event_count=3
            )
            assert accepted.event.slot == 4
            run = await world.runs.get(run_id)
            assert (run.seq, run.seq_in_band) == (4, 3)

    async def test_in_band_write_without_counts_is_a_contract_error(
        self, harness: WorldHarness
    ) -> None:
        """An in-band write lacking a count, or counting past seq, is a WorldContractError."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            before = await log_and_snapshot(world, run_id)
            with pytest.raises(errors.WorldContractError):
                await world.events.create(run_id, attr("a"), in_band=True, event_count=2)
            with pytest.raises(errors.WorldContractError):
                await world.events.create(run_id, attr("a"), in_band=True, expected_seq_in_band=2)
            with pytest.raises(errors.WorldContractError):
                await world.events.create(
                    run_id, attr("a"), in_band=True, expected_seq_in_band=2, event_count=3
                )
            with pytest.raises(errors.WorldContractError):
                await world.events.create_batch(run_id, [step_created("s1")], in_band=True)
            assert await log_and_snapshot(world, run_id) == before

    async def test_every_page_carries_the_snapshot_and_a_full_load_is_dense(
        self, harness: WorldHarness
    ) -> None:
        """Each events.list page has the run's snapshot; a full load covers slots 1..seq."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            await out_of_band(world, run_id, attr("a"))
            await out_of_band(world, run_id, attr("b"))
            await in_band(world, run_id, inline_start("s1"))
            await out_of_band(world, run_id, attr("c"))
            await in_band(world, run_id, step_completed("s1"))
            expected = events.Snapshot(seq=7, seq_in_band=4)
            assert (await world.runs.get(run_id)).snapshot == expected
            slots: list[int] = []
            after = 0
            for _ in range(20):
                page = await world.events.list(run_id, after_slot=after, limit=2)
                assert page.snapshot == expected
                assert len(page.events) <= 2
                slots.extend(e.slot for e in page.events)
                if not page.has_more:
                    break
                after = page.cursor
            assert slots == list(range(1, 8))

    async def test_skipped_slot_report_holds_the_events_since_event_count(
        self, harness: WorldHarness
    ) -> None:
        """An in-band write reports slots event_count+1 .. own-1; none when its count is seq."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            await out_of_band(world, run_id, attr("a"))
            await out_of_band(world, run_id, attr("b"))
            result = await world.events.create(
                run_id, inline_start("s1"), in_band=True, expected_seq_in_band=2, event_count=2
            )
            assert result.event.slot == 5
            logged = await full_log(world, run_id)
            assert [stored(e) for e in result.report] == [stored(e) for e in logged[2:4]]
            assert result.has_more is False
            current = await world.events.create(
                run_id, step_completed("s1"), in_band=True, expected_seq_in_band=3, event_count=5
            )
            assert (current.event.slot, current.report, current.has_more) == (6, (), False)

    async def test_batch_returns_the_skipped_slot_report_at_the_top_level(
        self, harness: WorldHarness
    ) -> None:
        """create_batch returns the block's skipped-slot report on the BatchResult."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            await out_of_band(world, run_id, attr("a"))
            await out_of_band(world, run_id, attr("b"))
            result = await world.events.create_batch(
                run_id,
                [step_created("s1"), wait_created("w1")],
                in_band=True,
                expected_seq_in_band=2,
                event_count=2,
            )
            logged = await full_log(world, run_id)
            assert [stored(e) for e in result.report] == [stored(e) for e in logged[2:4]]
            assert result.has_more is False
            assert [i.event.slot for i in result.items if i.event is not None] == [5, 6]

    async def test_in_band_occurred_at_is_stored_as_created_at(self, harness: WorldHarness) -> None:
        """An in-band write's occurred_at is the event's stored created_at (run-ahead clock)."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            result = await in_band(world, run_id, inline_start("s1"), occurred_at=OCCURRED_AT)
            logged = await full_log(world, run_id)
            assert logged[result.event.slot - 1].created_at == OCCURRED_AT

    async def test_in_band_batch_items_are_stored_at_occurred_at(
        self, harness: WorldHarness
    ) -> None:
        """A batch's occurred_at is every item's created_at ("on creates and batch items alike")."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            await world.events.create_batch(
                run_id,
                [inline_start("s1"), step_created("s2")],
                in_band=True,
                expected_seq_in_band=2,
                event_count=2,
                occurred_at=OCCURRED_AT,
            )
            logged = await full_log(world, run_id)
            assert [e.created_at for e in logged[2:]] == [OCCURRED_AT, OCCURRED_AT]

    async def test_out_of_band_write_ignores_occurred_at(self, harness: WorldHarness) -> None:
        """An out-of-band write is stored at the World's time, whatever occurred_at says."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            long_ago = datetime(2001, 1, 1, tzinfo=UTC)
            result = await out_of_band(world, run_id, attr("a"), occurred_at=long_ago)
            created_at = (await full_log(world, run_id))[result.event.slot - 1].created_at
            assert abs(created_at - datetime.now(UTC)) < timedelta(minutes=5)

    async def test_batch_lands_in_request_order_at_consecutive_slots(
        self, harness: WorldHarness
    ) -> None:
        """A batch takes one block of consecutive slots in request order, counted in-band."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            batch: list[events.Event] = [inline_start("s1"), step_created("s2"), wait_created("w1")]
            result = await world.events.create_batch(
                run_id, batch, in_band=True, expected_seq_in_band=2, event_count=2
            )
            assert result.allocated == 3
            assert all(item.ok and item.error is None for item in result.items)
            committed = [item.event for item in result.items if item.event is not None]
            assert [(e.slot, e.in_band, e.event) for e in committed] == [
                (3, True, batch[0]),
                (4, True, batch[1]),
                (5, True, batch[2]),
            ]
            assert [e.event for e in (await full_log(world, run_id))[2:]] == batch
            run = await world.runs.get(run_id)
            assert (run.seq, run.seq_in_band) == (5, 5)

    async def test_batch_refuses_every_later_item_of_a_refused_entity(
        self, harness: WorldHarness
    ) -> None:
        """A batch is not atomic, and after a refused item its entity's later items are refused."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            await in_band(world, run_id, inline_start("s1"))
            await in_band(world, run_id, step_completed("s1"))
            result = await world.events.create_batch(
                run_id,
                [inline_start("s1", attempt=2), step_completed("s1"), step_created("s2")],
                in_band=True,
                expected_seq_in_band=4,
                event_count=4,
            )
            first, second, third = result.items
            assert isinstance(first.error, errors.StepAlreadyEnded)
            assert isinstance(second.error, errors.EarlierItemRefused)
            assert second.error.correlation_id == "s1"
            assert (first.event, second.event, third.error) == (None, None, None)
            assert third.event is not None
            assert third.event.slot == 5
            assert result.allocated == 1
            run = await world.runs.get(run_id)
            assert (run.seq, run.seq_in_band) == (5, 5)

    async def test_batch_with_a_non_step_or_wait_event_is_refused_whole(
        self, harness: WorldHarness
    ) -> None:
        """create_batch takes step and wait events only; anything else refuses the whole batch."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            before = await log_and_snapshot(world, run_id)
            for foreign in (events.RunStarted(), hook_created("hook_1", unique("token"))):
                with pytest.raises(errors.WorldContractError):
                    await world.events.create_batch(
                        run_id,
                        [step_created("s1"), foreign],
                        in_band=True,
                        expected_seq_in_band=2,
                        event_count=2,
                    )
            assert await log_and_snapshot(world, run_id) == before

    async def test_stale_batch_is_refused_whole(self, harness: WorldHarness) -> None:
        """A batch under a stale count raises InBandSuperseded and allocates nothing."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            before = await log_and_snapshot(world, run_id)
            with pytest.raises(errors.InBandSuperseded):
                await world.events.create_batch(
                    run_id,
                    [step_created("s1"), wait_created("w1")],
                    in_band=True,
                    expected_seq_in_band=1,
                    event_count=1,
                )
            assert await log_and_snapshot(world, run_id) == before

    @pytest.mark.parametrize("ending", ENDINGS)
    async def test_terminal_run_refuses_new_work_and_accepts_outcomes(
        self, harness: WorldHarness, ending: str
    ) -> None:
        """A terminal run refuses REFUSED_ON_TERMINAL_RUN with RunExpired and takes outcomes.

        A ``wake_requested`` is among them (a ``wake_up`` after the run ended): the
        log keeps only outcomes, completions, disposals and attributes after the end.
        """
        async with opened(harness) as world:
            run_id = await started_run(world)
            await in_band(world, run_id, step_created("s1"))
            await in_band(world, run_id, step_created("s2"))
            await in_band(world, run_id, wait_created("w1"))
            s1_started = events.StepStarted(correlation_id="s1", step_name="fetch", attempt=1)
            await out_of_band(world, run_id, s1_started)
            await end_run(world, run_id, ending)
            ended = await world.runs.get(run_id)
            assert ended.status == ending
            refused: list[events.Event] = [
                events.RunStarted(),
                events.RunCompleted(),
                events.RunFailed(error=BOOM),
                events.RunCancelled(),
                step_created("s9"),
                inline_start("s8"),
                events.StepRetrying(correlation_id="s1", step_name="fetch", attempt=1, error=BOOM),
                wait_created("w9"),
                hook_created("hook_9", unique("token")),
                events.WakeRequested(),
                events.ChildCreated(
                    correlation_id="child_9", workflow_name="other", child_run_id=ids.new_run_id()
                ),
            ]
            assert {e.type for e in refused} == events.REFUSED_ON_TERMINAL_RUN
            for event in refused:
                with pytest.raises(errors.RunExpired) as expired:
                    await out_of_band(world, run_id, event)
                assert (expired.value.status, expired.value.event_type) == (ending, event.type)
            with pytest.raises(errors.RunExpired):
                await in_band(world, run_id, step_created("s9"))
            assert (await world.runs.get(run_id)).snapshot == ended.snapshot
            accepted = [
                await out_of_band(world, run_id, step_completed("s1", "fetch")),
                await out_of_band(world, run_id, step_failed("s2")),
                await in_band(world, run_id, events.WaitCompleted(correlation_id="w1")),
            ]
            assert [r.allocated for r in accepted] == [1, 1, 1]
            assert (await world.runs.get(run_id)).seq == ended.seq + 3

    async def test_fence_is_decided_before_the_terminal_check(self, harness: WorldHarness) -> None:
        """A stale in-band write on a terminal run hears InBandSuperseded, not RunExpired."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            await end_run(world, run_id, "completed")
            with pytest.raises(errors.InBandSuperseded):
                await world.events.create(
                    run_id, step_created("s1"), in_band=True, expected_seq_in_band=2, event_count=2
                )

    @pytest.mark.parametrize("outcome", ["step_completed", "step_failed"])
    async def test_step_started_after_the_steps_outcome_is_refused(
        self, harness: WorldHarness, outcome: str
    ) -> None:
        """A step_started for a step with an outcome raises StepAlreadyEnded, allocating nothing."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            await in_band(world, run_id, step_created("s1"))
            started = events.StepStarted(correlation_id="s1", step_name="fetch", attempt=1)
            await out_of_band(world, run_id, started)
            ended: events.Event = (
                step_completed("s1", "fetch") if outcome == "step_completed" else step_failed("s1")
            )
            outcome_slot = (await out_of_band(world, run_id, ended)).event.slot
            before = await log_and_snapshot(world, run_id)
            again = events.StepStarted(correlation_id="s1", step_name="fetch", attempt=2)
            with pytest.raises(errors.StepAlreadyEnded) as refused:
                await out_of_band(world, run_id, again)
            assert (refused.value.step_id, refused.value.outcome_slot) == ("s1", outcome_slot)
            with pytest.raises(errors.StepAlreadyEnded):
                await in_band(world, run_id, again)
            assert await log_and_snapshot(world, run_id) == before

    @pytest.mark.parametrize("stale", [1, 2])
    async def test_a_step_started_not_past_the_latest_attempt_is_refused(
        self, harness: WorldHarness, stale: int
    ) -> None:
        """Simulation seed 522: a start at attempt 2 then one at ``stale`` (1 or 2) raises
        StaleStepStart, in-band or out-of-band, allocating nothing; attempt 3 is taken."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            await in_band(world, run_id, step_created("s1"))
            second = events.StepStarted(correlation_id="s1", step_name="fetch", attempt=2)
            await out_of_band(world, run_id, second)
            before = await log_and_snapshot(world, run_id)
            late = events.StepStarted(correlation_id="s1", step_name="fetch", attempt=stale)
            with pytest.raises(errors.StaleStepStart) as refused:
                await out_of_band(world, run_id, late)
            facts = (refused.value.run_id, refused.value.step_id, refused.value.attempt)
            assert facts == (run_id, "s1", stale)
            assert refused.value.latest_attempt == 2
            with pytest.raises(errors.StaleStepStart):
                await in_band(world, run_id, late)
            assert await log_and_snapshot(world, run_id) == before
            third = events.StepStarted(correlation_id="s1", step_name="fetch", attempt=3)
            taken = await out_of_band(world, run_id, third)
            assert taken.event.slot == before[1].seq + 1
            step = await world.steps.get(run_id, "s1")
            assert (step.status, step.attempt) == ("running", 3)

    @pytest.mark.parametrize("first", ["step_completed", "step_failed"])
    @pytest.mark.parametrize("second", ["step_completed", "step_failed"])
    async def test_a_second_outcome_for_a_step_is_refused_allocating_nothing(
        self, harness: WorldHarness, first: str, second: str
    ) -> None:
        """F2, DESIGN.md 10: a step_completed/step_failed for a step with an outcome raises
        StepAlreadyEnded (naming the outcome's slot), in-band or out-of-band; nothing moves."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            await in_band(world, run_id, step_created("s1"))
            await out_of_band(world, run_id, events.StepStarted(
                correlation_id="s1", step_name="fetch", attempt=1))  # fmt: skip
            won = step_completed("s1", "fetch") if first == "step_completed" else step_failed("s1")
            outcome_slot = (await out_of_band(world, run_id, won)).event.slot
            before = await log_and_snapshot(world, run_id)
            late: events.Event = (
                events.StepCompleted(correlation_id="s1", step_name="fetch", result="stale")
                if second == "step_completed"
                else step_failed("s1", attempt=2)
            )
            for write in (out_of_band, in_band):
                with pytest.raises(errors.StepAlreadyEnded) as refused:
                    await write(world, run_id, late)
                assert (refused.value.step_id, refused.value.outcome_slot) == ("s1", outcome_slot)
                assert refused.value.event_type == second
            assert await log_and_snapshot(world, run_id) == before
            step = await world.steps.get(run_id, "s1")
            assert step.status == ("completed" if first == "step_completed" else "failed")

    async def test_a_stalled_deliverys_outcome_after_run_completed_is_refused(
        self, harness: WorldHarness
    ) -> None:
        """F2's timeline: attempt 1 stalls, attempt 2 completes, the run completes, then the
        stalled attempt's outcome arrives: refused, so the log keeps one outcome per step."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            await in_band(world, run_id, step_created("body"))
            for attempt in (1, 2):
                await out_of_band(world, run_id, events.StepStarted(
                    correlation_id="body", step_name="fetch", attempt=attempt))  # fmt: skip
            winner = events.StepCompleted(correlation_id="body", step_name="fetch", result=2)
            won = await out_of_band(world, run_id, winner)
            await end_run(world, run_id, "completed")
            before = await log_and_snapshot(world, run_id)
            stale = events.StepCompleted(correlation_id="body", step_name="fetch", result=1)
            with pytest.raises(errors.StepAlreadyEnded) as refused:
                await out_of_band(world, run_id, stale)
            assert refused.value.outcome_slot == won.event.slot
            assert await log_and_snapshot(world, run_id) == before
            log = await full_log(world, run_id)
            outcomes = [e for e in log if e.type in events.STEP_OUTCOME_TYPES]
            assert [stored(e) for e in outcomes] == [stored(won.event)]

    async def test_a_batch_item_outcome_for_an_ended_step_is_refused(
        self, harness: WorldHarness
    ) -> None:
        """A batch carrying a second outcome refuses that item alone (F2), allocating the rest."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            await in_band(world, run_id, inline_start("s1"))
            await in_band(world, run_id, step_completed("s1"))
            result = await world.events.create_batch(
                run_id,
                [step_completed("s1"), step_created("s2")],
                in_band=True,
                expected_seq_in_band=4,
                event_count=4,
            )
            refused, created = result.items
            assert isinstance(refused.error, errors.StepAlreadyEnded)
            assert refused.error.outcome_slot == 4
            assert created.event is not None
            assert created.event.slot == 5
            assert result.allocated == 1

    @pytest.mark.parametrize("ended", [False, True])
    async def test_a_second_wait_completed_is_refused_allocating_nothing(
        self, harness: WorldHarness, ended: bool
    ) -> None:
        """DESIGN.md 10: at most one completion per wait; a second raises WaitAlreadyCompleted
        (naming the first's slot), on a running or an ended run, and writes nothing."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            await in_band(world, run_id, wait_created("w1"))
            first = await in_band(world, run_id, events.WaitCompleted(correlation_id="w1"))
            if ended:
                await end_run(world, run_id, "completed")
            before = await log_and_snapshot(world, run_id)
            for write in (in_band, out_of_band):
                with pytest.raises(errors.WaitAlreadyCompleted) as refused:
                    await write(world, run_id, events.WaitCompleted(correlation_id="w1"))
                assert (refused.value.wait_id, refused.value.completed_slot) == (
                    "w1",
                    first.event.slot,
                )
            assert await log_and_snapshot(world, run_id) == before

    async def test_idempotency_key_makes_a_retried_write_converge(
        self, harness: WorldHarness
    ) -> None:
        """A second write under one idempotency_key returns the first's event, allocated 0."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            first = await out_of_band(world, run_id, attr("a"), idempotency_key="k")
            again = await out_of_band(world, run_id, attr("a"), idempotency_key="k")
            assert (first.allocated, again.allocated) == (1, 0)
            assert stored(again.event) == stored(first.event)
            assert (await world.runs.get(run_id)).seq == first.event.slot
            assert len(await full_log(world, run_id)) == 3
