"""Pure parts of the contract: ids, routing, backoff, message stamps."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from treadle.world import contract, ids, messages, routing

NOW = datetime(2026, 11, 30, tzinfo=UTC)


def test_run_ids_carry_their_creation_time() -> None:
    """The run id's ULID gives back the millisecond it was minted at."""
    at_ms = 1_796_000_000_123
    run_id = ids.new_run_id(at_ms)
    assert ids.is_run_id(run_id)
    assert ids.run_created_at(run_id) == datetime.fromtimestamp(at_ms / 1000, tz=UTC)


def test_run_ids_are_unique_and_sort_by_time() -> None:
    """Ids minted later sort later; random bits keep same-millisecond ids apart."""
    same = {ids.new_run_id(1000) for _ in range(100)}
    assert len(same) == 100
    assert ids.new_run_id(1000) < ids.new_run_id(2000)


def test_a_malformed_run_id_is_named() -> None:
    """Reading the time of something that is not a run id says what was expected."""
    with pytest.raises(ValueError, match="is not a run id"):
        ids.run_created_at("wrun_nope")


def _orch(**fields: object) -> messages.OrchestratorMessage:
    return messages.OrchestratorMessage.model_validate({"run_id": "wrun_x", **fields})


def test_a_keyed_run_id_is_a_run_id_named_by_its_key_whose_clock_starts_when_recorded() -> None:
    """Issue 11 item 2: the operator names a WorkflowRun's run by a key. The id has the run
    id shape (the Worlds accept it), the same key gives the same id, and with no time in it
    the workflow clock starts at the recorded run_created time, while a ULID run id keeps
    its own time."""
    keyed = ids.keyed_run_id("ns\0name\0")
    assert ids.is_run_id(keyed) and ids.is_keyed_run_id(keyed)
    assert keyed == ids.keyed_run_id("ns\0name\0") != ids.keyed_run_id("ns\0name\0k")
    recorded = datetime(2026, 12, 1, 13, 0, tzinfo=UTC)
    assert ids.clock_origin(keyed, recorded) == recorded
    plain = ids.new_run_id()
    assert not ids.is_keyed_run_id(plain)
    assert ids.clock_origin(plain, recorded) == ids.run_created_at(plain)


def test_spec_9_orchestrator_messages_are_gated_by_run() -> None:
    """A stamped spec 9 wake joins its run's line."""
    assert routing.gated_run_id(_orch(run_spec_version=9), None) == "wrun_x"


def test_the_run_input_stamp_wins() -> None:
    """run_input's spec version is read before run_spec_version."""
    start = _orch(
        run_input={"workflow_name": "w", "spec_version": 8, "created_at": NOW},
        run_spec_version=9,
    )
    assert start.spec_version == 8
    assert routing.gated_run_id(start, None) is None


def test_unstamped_messages_are_gated_by_the_run_row() -> None:
    """An unstamped message takes the run row's version; an unknown run is gated anyway."""
    assert routing.gated_run_id(_orch(), 9) == "wrun_x"
    assert routing.gated_run_id(_orch(), 8) is None
    assert routing.gated_run_id(_orch(), None) == "wrun_x"


def test_intermediate_hops_and_step_messages_are_never_gated() -> None:
    """A hop carrying the wait's deadline, and any step message, are never held."""
    hop = _orch(
        run_spec_version=9,
        wait_continuation={"correlation_id": "wait_1", "hop_at_ms": 1, "resume_at_ms": 9},
    )
    final = _orch(run_spec_version=9, wait_continuation={"correlation_id": "w", "hop_at_ms": 9})
    step = messages.StepMessage(
        run_id="wrun_x",
        step_id="step_1",
        step_name="s",
        step_created_at=NOW,
        run_context=messages.RunContext(spec_version=9, workflow_name="w"),
    )
    assert hop.is_intermediate_hop
    assert routing.gated_run_id(hop, 9) is None
    assert routing.gated_run_id(final, 9) == "wrun_x"
    assert routing.gated_run_id(step, 9) is None


def test_backoff_doubles_up_to_its_cap() -> None:
    """Exception backoff: base, 2x base, ... capped."""
    tuning = contract.QueueTuning(backoff_base_seconds=1.0, backoff_max_seconds=5.0)
    assert [tuning.backoff_seconds(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_redeliver_refuses_a_negative_delay() -> None:
    """Redeliver(-1) is a programming error caught where it is made."""
    with pytest.raises(ValueError, match="seconds >= 0"):
        messages.Redeliver(-1)
