"""Run status folded from events: counts, waits, output truncation; never the log itself."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

from treadle import payloads
from treadle.world import events, records
from treadle_operator.models import WorkflowRunStatus
from treadle_operator.progress import OUTPUT_LIMIT, RunView, status_of

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _logged(slot: int, event: events.Event) -> events.LoggedEvent:
    return events.LoggedEvent(run_id="wrun_x", slot=slot, created_at=T0, in_band=True, event=event)


def _run(status: records.RunStatus, output: object = None) -> records.RunRecord:
    return records.RunRecord(
        run_id="wrun_x", workflow_name="order", status=status, deployment_id="orders-abc123",
        spec_version=9, input=None, created_at=T0, updated_at=T0, seq=1, seq_in_band=1,
        started_at=T0, output=output,
    )  # fmt: skip


def test_counts_and_waits_follow_the_log_once() -> None:
    view = RunView()
    feed = [
        events.StepCreated(correlation_id="s1", step_name="a"),
        events.StepStarted(correlation_id="s1", step_name="a", attempt=1),
        events.StepCompleted(correlation_id="s1", step_name="a"),
        events.StepStarted(correlation_id="s2", step_name="b", attempt=1, inline=True),
        events.WaitCreated(correlation_id="w1", resume_at=T0),
        events.HookCreated(correlation_id="h1", token="approve:o-1"),
    ]
    logged = [_logged(n, e) for n, e in enumerate(feed, start=2)]
    for item in logged + logged:  # a second delivery of the same events changes nothing
        view.apply(item)
    status = status_of(_run("running"), view, WorkflowRunStatus())
    assert status.steps.model_dump() == {"total": 2, "completed": 1, "failed": 0, "running": 1}
    assert status.steps_summary == "1/2"
    assert status.waiting_on == ["sleep until 2026-11-30T12:00:00Z", "hook approve:o-1"]
    assert status.phase == "Running" and status.revision == "orders-abc123"
    view.apply(_logged(8, events.WaitCompleted(correlation_id="w1")))
    view.apply(_logged(9, events.HookReceived(correlation_id="h1")))
    assert status_of(_run("running"), view, status).waiting_on == []


def test_output_is_truncated_json() -> None:
    done = status_of(_run("completed", output="x" * 10_000), RunView(), WorkflowRunStatus())
    assert done.phase == "Completed"
    assert done.output is not None and len(done.output) == OUTPUT_LIMIT
    assert done.output.endswith("... (truncated)")
    assert done.waiting_on == []


def test_an_encrypted_output_shows_only_to_an_operator_holding_its_key() -> None:
    """Issue 16 item 4: status.output opens with the deployment's keys, else "<encrypted>"."""
    ring = payloads.KeyRing.parse("k1:" + base64.b64encode(bytes(32)).decode())
    sealed = payloads.seal({"total": 42}, ring)
    run = _run("completed", output=sealed)
    assert status_of(run, RunView(), WorkflowRunStatus(), keys=ring).output == '{"total":42}'
    assert status_of(run, RunView(), WorkflowRunStatus()).output == '"<encrypted>"'
