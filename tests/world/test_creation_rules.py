"""The one-creation and spec-event rules as pure functions (``treadle.world.storagerules``).

Issue 12 item 2: every World asks ``created_by`` which earlier events make a write a
second creation and hands the first one's slot to ``check_creation``; the conformance
suite (``storage_spec8``) pins what each World does with them. These pin the table.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from treadle import errors
from treadle.world import events, storagerules

AT = datetime(2030, 1, 1, tzinfo=UTC)


def _start(*, inline: bool, attempt: int) -> events.StepStarted:
    return events.StepStarted(correlation_id="s1", step_name="add", attempt=attempt, inline=inline)


def test_each_creation_names_what_already_created_its_entity() -> None:
    """A step is created by step_created or its inline first start; a hook's creation may
    be stored as hook_conflict; run_started is the run's own (no correlation id)."""
    assert storagerules.created_by(events.RunStarted()) == {"run_started"}
    created = events.StepCreated(correlation_id="s1", step_name="add")
    assert storagerules.created_by(created) == {"step_created", "step_started"}
    wait = events.WaitCreated(correlation_id="w1", resume_at=AT)
    assert storagerules.created_by(wait) == {"wait_created"}
    hook = events.HookCreated(correlation_id="h1", token="t")
    assert storagerules.created_by(hook) == {"hook_created", "hook_conflict"}
    assert storagerules.created_by(_start(inline=True, attempt=1)) == {"step_created"}


def test_starts_that_create_nothing_need_no_lookup() -> None:
    """A bare start, a re-start (attempt > 1) and other events are not creations."""
    assert storagerules.created_by(_start(inline=False, attempt=1)) is None
    assert storagerules.created_by(_start(inline=True, attempt=2)) is None
    assert storagerules.created_by(events.WaitCompleted(correlation_id="w1")) is None
    assert storagerules.created_by(events.RunCompleted()) is None


def test_a_found_creation_is_refused_with_its_slot() -> None:
    """check_creation raises EntityAlreadyCreated naming the first slot, or passes."""
    storagerules.check_creation("wrun_x", events.RunStarted(), None)
    with pytest.raises(errors.EntityAlreadyCreated) as refused:
        storagerules.check_creation(
            "wrun_x", events.WaitCreated(correlation_id="w1", resume_at=AT), 4
        )
    assert (refused.value.run_id, refused.value.correlation_id) == ("wrun_x", "w1")
    assert (refused.value.event_type, refused.value.slot) == ("wait_created", 4)
    assert "slot 4" in str(refused.value)
    assert isinstance(refused.value, errors.WorldError)


def test_a_spec_9_event_on_a_spec_8_run_is_a_contract_error() -> None:
    """wake_requested on a run below 9 is refused with the run and its version named."""
    storagerules.check_spec_event("wrun_x", 9, events.WakeRequested())
    storagerules.check_spec_event("wrun_x", 8, events.RunStarted())
    with pytest.raises(errors.WorldContractError, match="wrun_x is spec 8") as refused:
        storagerules.check_spec_event("wrun_x", 8, events.WakeRequested())
    assert "a spec 8 run never receives a spec 9 event" in str(refused.value)
