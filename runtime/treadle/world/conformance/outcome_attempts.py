"""Outcome attempt conformance: a step outcome is taken only from the step's latest
started attempt (``storagerules.check_outcome_attempt``; docs/timeouts.md).

The timeline it recreates is the timed-out background attempt's (issue 17 item 5):
attempt 1 starts, its redelivery records its lapse (``step_retrying``) and starts
attempt 2, then attempt 1's late outcome arrives, however late its writer's re-read
of the log was: refused as ``StaleStepOutcome``, nothing allocated; attempt 2's
outcome is taken. Out-of-band (a background step's writes), in-band (an inline
step's) and in a batch (the item alone).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from treadle import errors
from treadle.world import contract, events
from treadle.world.conformance.harness import WorldHarness
from treadle.world.conformance.support import (
    BOOM,
    full_log,
    in_band,
    log_and_snapshot,
    opened,
    out_of_band,
    started_run,
    step_created,
)

LAPSE = events.ErrorInfo(message="attempt 1 timed out after 1s", type="StepTimedOut")


def start(attempt: int) -> events.StepStarted:
    return events.StepStarted(correlation_id="s1", step_name="fetch", attempt=attempt)


def outcome(kind: str, attempt: int) -> events.Event:
    """The outcome ``kind`` of attempt ``attempt`` of step s1."""
    if kind == "step_completed":
        return events.StepCompleted(
            correlation_id="s1", step_name="fetch", result=f"from {attempt}", attempt=attempt
        )
    if kind == "step_failed":
        return events.StepFailed(
            correlation_id="s1", step_name="fetch", attempt=attempt, error=BOOM
        )
    return events.StepRetrying(
        correlation_id="s1",
        step_name="fetch",
        attempt=attempt,
        error=BOOM,
        retry_after=datetime(2030, 1, 1, tzinfo=UTC),
    )


async def timed_out_twice_started(world: contract.World, run_id: str) -> None:
    """Attempt 1 started, its lapse recorded by a redelivery, attempt 2 started."""
    await in_band(world, run_id, step_created("s1"))
    await out_of_band(world, run_id, start(1))
    lapse = events.StepRetrying(correlation_id="s1", step_name="fetch", attempt=1, error=LAPSE)
    await out_of_band(world, run_id, lapse)
    await out_of_band(world, run_id, start(2))


class OutcomeAttemptConformance:
    """Subclass it as ``Test...`` with a harness."""

    @pytest.mark.parametrize("late", ["step_completed", "step_failed", "step_retrying"])
    async def test_a_timed_out_attempts_late_outcome_is_refused_and_the_next_taken(
        self, harness: WorldHarness, late: str
    ) -> None:
        """Attempt 1 timed out and attempt 2 started: attempt 1's late ``late`` is
        StaleStepOutcome (naming both attempts), out-of-band or in-band, allocating
        nothing; then attempt 2's step_completed is the step's outcome."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            await timed_out_twice_started(world, run_id)
            before = await log_and_snapshot(world, run_id)
            for write in (out_of_band, in_band):
                with pytest.raises(errors.StaleStepOutcome) as refused:
                    await write(world, run_id, outcome(late, 1))
                facts = refused.value
                assert (facts.run_id, facts.step_id, facts.event_type) == (run_id, "s1", late)
                assert (facts.attempt, facts.latest_attempt) == (1, 2)
                assert "attempt 2 started after it" in str(facts)
            assert await log_and_snapshot(world, run_id) == before
            won = await out_of_band(world, run_id, outcome("step_completed", 2))
            assert won.event.slot == before[1].seq + 1
            step = await world.steps.get(run_id, "s1")
            assert (step.status, step.attempt, step.result) == ("completed", 2, "from 2")
            log = await full_log(world, run_id)
            outcomes = [e.event for e in log if e.type in events.STEP_OUTCOME_TYPES]
            assert outcomes == [outcome("step_completed", 2)]

    async def test_an_outcome_of_an_attempt_never_started_is_refused(
        self, harness: WorldHarness
    ) -> None:
        """Attempt 1 started: an outcome naming attempt 2 is StaleStepOutcome too (the
        latest started attempt is 1); attempt 1's own outcome is taken."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            await in_band(world, run_id, step_created("s1"))
            await out_of_band(world, run_id, start(1))
            with pytest.raises(errors.StaleStepOutcome) as refused:
                await out_of_band(world, run_id, outcome("step_failed", 2))
            assert (refused.value.attempt, refused.value.latest_attempt) == (2, 1)
            await out_of_band(world, run_id, outcome("step_failed", 1))
            assert (await world.steps.get(run_id, "s1")).status == "failed"

    async def test_outcomes_the_rule_does_not_judge_are_taken(self, harness: WorldHarness) -> None:
        """A step no attempt started takes a failure naming attempt 1 (one failed before
        its first start); a step_completed naming no attempt (an earlier release's
        writer) is taken whatever started; a step_retrying of the latest attempt after
        the step's outcome stays inert, not refused."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            await in_band(world, run_id, step_created("s1"))
            await out_of_band(world, run_id, outcome("step_failed", 1))
            assert (await world.steps.get(run_id, "s1")).status == "failed"
            await in_band(world, run_id, step_created("s2"))
            for attempt in (1, 2):
                await out_of_band(world, run_id, events.StepStarted(
                    correlation_id="s2", step_name="fetch", attempt=attempt))  # fmt: skip
            unnamed = events.StepCompleted(correlation_id="s2", step_name="fetch", result="old")
            await out_of_band(world, run_id, unnamed)
            retry = outcome("step_retrying", 2).model_copy(update={"correlation_id": "s2"})
            await out_of_band(world, run_id, retry)
            step = await world.steps.get(run_id, "s2")
            assert (step.status, step.result) == ("completed", "old")

    async def test_a_batch_refuses_the_stale_outcome_alone(self, harness: WorldHarness) -> None:
        """In create_batch the stale outcome is the item's refusal; the other items land."""
        async with opened(harness) as world:
            run_id = await started_run(world)
            await timed_out_twice_started(world, run_id)
            snapshot = (await log_and_snapshot(world, run_id))[1]
            result = await world.events.create_batch(
                run_id,
                [outcome("step_completed", 1), step_created("s3")],
                in_band=True,
                expected_seq_in_band=snapshot.seq_in_band,
                event_count=snapshot.seq,
            )
            refused, created = result.items
            assert isinstance(refused.error, errors.StaleStepOutcome)
            assert refused.error.latest_attempt == 2
            assert created.event is not None
            assert created.event.slot == snapshot.seq + 1
            assert result.allocated == 1
            assert (await world.steps.get(run_id, "s1")).status == "running"
