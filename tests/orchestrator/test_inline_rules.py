"""The pure rules behind the inline-step fixes (audit bugs 1, 4, 11 and F1, F3).

``LogState`` files a moved inline retry with the background steps, so
``decisions.inline_to_rerun`` never returns it while the re-send rule still
does; ``messages.handoff_counted`` is the one handoff bound of every queue; a
writer whose delivery lost its lease writes nothing (a real local World).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from treadle.orchestrator import decisions
from treadle.orchestrator.inline import check_lease
from treadle.orchestrator.logstate import LogState
from treadle.orchestrator.writer import InBandWriter, LeaseLost
from treadle.world import constants, events, messages
from treadle.worlds.local import LocalWorld

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
ERROR = events.ErrorInfo(message="busy")


def _state(*evs: events.Event) -> LogState:
    state = LogState("wrun_x")
    for slot, event in enumerate(evs, start=1):
        logged = events.LoggedEvent(
            run_id="wrun_x", slot=slot, created_at=NOW, in_band=True, event=event
        )
        state.apply(logged)
    return state


def _started(attempt: int, *, inline: bool) -> events.StepStarted:
    return events.StepStarted(correlation_id="s1", step_name="a", attempt=attempt, inline=inline)


def test_a_moved_inline_retry_is_never_a_dead_deliverys_step() -> None:
    """Bug 1 / F1: after the orchestrator's step_retrying (creator set), the step's own
    message's out-of-band start does not make it an inline step to re-run or fail."""
    moved = events.StepRetrying(
        correlation_id="s1", step_name="a", attempt=1, error=ERROR, creator_message_id="m"
    )
    state = _state(_started(1, inline=True), moved, _started(2, inline=False))
    assert state.open_inline_steps == set()
    assert state.open_background_steps == {"s1"}
    assert decisions.inline_to_rerun(state, running=set()) == []
    assert state.has_open_background_step()  # a delivery may linger on it


def test_a_moved_retry_is_still_resent_until_its_message_starts_it() -> None:
    """The re-send rule keeps its case: last event the creator-stamped step_retrying."""
    moved = events.StepRetrying(
        correlation_id="s1", step_name="a", attempt=1, error=ERROR, creator_message_id="m"
    )
    state = _state(_started(1, inline=True), moved)
    chosen = decisions.steps_to_resend(state, now=NOW, recovery=False)
    assert [(r.step.step_id, r.attempt) for r in chosen] == [("s1", 2)]


def test_an_inline_step_a_dead_delivery_started_is_still_rerun() -> None:
    """The rule's own case stays: an inline start, no outcome, not running here."""
    state = _state(_started(1, inline=True))
    assert [s.step_id for s in decisions.inline_to_rerun(state, running=set())] == ["s1"]
    assert decisions.inline_to_rerun(state, running={"s1"}) == []
    retried_in_place = events.StepRetrying(correlation_id="s1", step_name="a", attempt=1,
                                           error=ERROR)  # fmt: skip
    state = _state(_started(1, inline=True), retried_in_place, _started(2, inline=True))
    assert [s.step_id for s in decisions.inline_to_rerun(state, running=set())] == ["s1"]


def test_handoffs_are_counted_past_the_one_bound() -> None:
    """Bug 4: the same bound for every queue (local and NATS)."""
    assert not messages.handoff_counted(0)
    assert not messages.handoff_counted(constants.MAX_HANDOFFS - 1)
    assert messages.handoff_counted(constants.MAX_HANDOFFS)


def _meta(lost: asyncio.Event | None) -> messages.DeliveryMeta:
    return messages.DeliveryMeta("msg_1", 1, 1, 0, lease_lost=lost)


def test_check_lease_raises_only_once_the_queue_said_so() -> None:
    """F3: a delivery with no word from its queue, or a live lease, carries on."""
    check_lease(_meta(None), "wrun_x")
    lost = asyncio.Event()
    check_lease(_meta(lost), "wrun_x")
    lost.set()
    with pytest.raises(LeaseLost):
        check_lease(_meta(lost), "wrun_x")


async def test_a_writer_whose_lease_was_lost_writes_nothing(tmp_path: Path) -> None:
    """F3: once lease_lost is set every in-band write raises LeaseLost, and the World's
    log is unchanged."""
    world = await LocalWorld(tmp_path / "world").open()
    try:
        run = await world.runs.create(
            workflow_name="wf", input=None, deployment_id="d",
            spec_version=constants.SPEC_VERSION_SINGLE_ORCHESTRATOR,
        )  # fmt: skip
        page = await world.events.list(run.run_id)
        lost = asyncio.Event()
        writer = InBandWriter(world, run.run_id, page.snapshot, lost)
        await writer.create(events.RunStarted())
        lost.set()
        with pytest.raises(LeaseLost):
            await writer.create(events.WaitCreated(correlation_id="w1", resume_at=NOW))
        with pytest.raises(LeaseLost):
            await writer.create_batch([events.WaitCreated(correlation_id="w2", resume_at=NOW)])
        after = await world.events.list(run.run_id)
        assert [e.type for e in after.events] == ["run_created", "run_started"]
    finally:
        await world.close()
