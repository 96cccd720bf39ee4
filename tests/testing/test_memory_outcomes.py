"""The in-memory World refuses a second outcome per step and a second completion per wait.

DESIGN.md section 10 ("Invariants the World enforces itself") and issue 10 item 2: a
stalled delivery that resumes cannot add a second step_completed or step_failed, nor
a second wait_completed, even after run_completed; the refusal allocates nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from treadle import errors
from treadle.testing.memory import MemoryBackend, MemoryWorld
from treadle.world import constants, events, logcheck

BOOM = events.ErrorInfo(message="boom")


async def _started(world: MemoryWorld) -> str:
    run = await world.runs.create(
        workflow_name="wf",
        input=None,
        deployment_id="d",
        spec_version=constants.SPEC_VERSION_SINGLE_ORCHESTRATOR,
    )
    await world.events.create(
        run.run_id, events.RunStarted(), in_band=True, expected_seq_in_band=1, event_count=1
    )
    return run.run_id


def _completed(step_id: str) -> events.StepCompleted:
    return events.StepCompleted(correlation_id=step_id, step_name="f", result=1)


def _failed(step_id: str) -> events.StepFailed:
    return events.StepFailed(correlation_id=step_id, step_name="f", attempt=1, error=BOOM)


@pytest.mark.parametrize("second", ["step_completed", "step_failed"])
async def test_a_second_step_outcome_is_refused_and_allocates_nothing(second: str) -> None:
    """After step_completed, another outcome raises StepAlreadyEnded naming the first slot."""
    backend = MemoryBackend()
    world = MemoryWorld(backend)
    run_id = await _started(world)
    await world.events.create(
        run_id, events.StepCreated(correlation_id="s1", step_name="f"), in_band=False
    )
    first = await world.events.create(run_id, _completed("s1"), in_band=False)
    # The run ends; a stalled delivery resuming afterwards must still be refused.
    run = backend.run_record(run_id)
    await world.events.create(
        run_id, events.RunCompleted(), in_band=True,
        expected_seq_in_band=run.seq_in_band, event_count=run.seq,
    )  # fmt: skip
    seq = backend.run_record(run_id).seq
    again = _completed("s1") if second == "step_completed" else _failed("s1")
    with pytest.raises(errors.StepAlreadyEnded) as refused:
        await world.events.create(run_id, again, in_band=False)
    assert refused.value.outcome_slot == first.event.slot
    assert backend.run_record(run_id).seq == seq
    assert logcheck.problems(backend.run_record(run_id), backend.events_of(run_id)) == []


async def test_a_second_outcome_in_a_batch_is_refused_with_its_entitys_later_items() -> None:
    """In create_batch the second outcome is an item refusal; other items still land."""
    backend = MemoryBackend()
    world = MemoryWorld(backend)
    run_id = await _started(world)
    await world.events.create(
        run_id, events.StepCreated(correlation_id="s1", step_name="f"), in_band=False
    )
    await world.events.create(run_id, _failed("s1"), in_band=False)
    result = await world.events.create_batch(
        run_id,
        [_completed("s1"), _failed("s1"), events.StepCreated(correlation_id="s2", step_name="f")],
        in_band=False,
    )
    kinds = [type(item.error) if item.error else "ok" for item in result.items]
    assert kinds == [errors.StepAlreadyEnded, errors.EarlierItemRefused, "ok"]
    assert result.allocated == 1


async def test_a_second_wait_completed_is_refused_and_allocates_nothing() -> None:
    """A wait completes once: a second wait_completed raises WaitAlreadyCompleted."""
    backend = MemoryBackend()
    world = MemoryWorld(backend)
    run_id = await _started(world)
    created = events.WaitCreated(correlation_id="w1", resume_at=datetime(2030, 1, 1, tzinfo=UTC))
    await world.events.create(run_id, created, in_band=False)
    done = await world.events.create(
        run_id, events.WaitCompleted(correlation_id="w1"), in_band=False
    )
    seq = backend.run_record(run_id).seq
    with pytest.raises(errors.WaitAlreadyCompleted) as refused:
        await world.events.create(run_id, events.WaitCompleted(correlation_id="w1"), in_band=False)
    assert (refused.value.wait_id, refused.value.completed_slot) == ("w1", done.event.slot)
    assert backend.run_record(run_id).seq == seq
    batch = await world.events.create_batch(
        run_id, [events.WaitCompleted(correlation_id="w1")], in_band=False
    )
    assert isinstance(batch.items[0].error, errors.WaitAlreadyCompleted)
    assert batch.allocated == 0


async def test_hook_received_frees_the_token_and_a_second_payload_is_hook_not_found() -> None:
    """A hook takes one payload (Bug 6, as helper D's local World): the token is free again."""
    world = MemoryWorld(MemoryBackend())
    run_id = await _started(world)
    created = events.HookCreated(correlation_id="h1", token="tok")
    await world.events.create(run_id, created, in_band=False)
    await world.events.create(run_id, events.HookReceived(correlation_id="h1"), in_band=False)
    with pytest.raises(errors.HookNotFound):
        await world.hooks.get_by_token("tok")
    with pytest.raises(errors.HookNotFound):
        await world.events.create(run_id, events.HookReceived(correlation_id="h1"), in_band=False)
    again = events.HookCreated(correlation_id="h2", token="tok")
    assert (await world.events.create(run_id, again, in_band=False)).event.type == "hook_created"
