"""What a WorkflowRun's status tells kubectl and GitOps tools (issue 11 item 1, review §2 (f),
(g), (h) and R6): terminal conditions, a short message, duration, bounded waitingOn, labels.
The real-API test (`kubectl wait --for=condition=Succeeded`) is in tests/k8s."""

from __future__ import annotations

from treadle_operator import runstatus
from treadle_operator.models import RunError, WorkflowRunStatus


def _conditions(status: WorkflowRunStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


def test_a_completed_run_is_succeeded_and_not_failed_with_its_duration() -> None:
    done = runstatus.present(
        WorkflowRunStatus(
            phase="Completed", started_at="2026-12-01T13:00:00Z",
            completed_at="2026-12-01T13:02:05Z",
        ),
        generation=3,
    )  # fmt: skip
    assert _conditions(done) == {
        "Succeeded": ("True", "Completed"), "Failed": ("False", "Completed")
    }  # fmt: skip
    assert done.duration == "2m5s" and done.message == "completed in 2m5s"
    assert done.observed_generation == 3
    assert all(c.observed_generation == 3 for c in done.conditions)


def test_a_failed_or_cancelled_run_is_failed_with_the_reason_and_message() -> None:
    failed = runstatus.present(
        WorkflowRunStatus(
            phase="Failed", reason="Failed", error=RunError(type="ValueError", message="no\nstock")
        ),
        generation=1,
    )
    assert _conditions(failed) == {"Succeeded": ("False", "Failed"), "Failed": ("True", "Failed")}
    assert failed.message == "ValueError: no stock"
    assert [c.message for c in failed.conditions if c.type == "Failed"] == [failed.message]
    cancelled = runstatus.present(WorkflowRunStatus(phase="Cancelled", reason="Cancelled"), 1)
    assert _conditions(cancelled)["Failed"] == ("True", "Cancelled")
    refused = runstatus.present(WorkflowRunStatus(phase="Failed", reason="UnknownWorkflow"), 1)
    assert _conditions(refused)["Failed"] == ("True", "UnknownWorkflow")


def test_an_unfinished_run_has_both_terminal_conditions_unknown() -> None:
    running = runstatus.present(WorkflowRunStatus(phase="Running", reason="Running"), 1)
    assert _conditions(running) == {
        "Succeeded": ("Unknown", "Running"), "Failed": ("Unknown", "Running")
    }  # fmt: skip
    assert running.duration is None


def test_waiting_on_keeps_the_first_twenty_and_counts_them_all() -> None:
    """Review R6: a 10k-hook fan-out must not write 10k strings into status."""
    many = [f"hook h{i:05d}" for i in range(10_000)]
    first, count = runstatus.bound_waiting(many)
    assert first == many[:20] and count == 10_000
    shown = runstatus.present(
        WorkflowRunStatus(phase="Running", waiting_on=first, waiting_on_count=count), 1
    )
    assert shown.waiting_on == many[:20] and shown.waiting_on_count == 10_000
    assert shown.message == "waiting on hook h00000 (+9999 more)"
    again = runstatus.present(shown, 1)
    assert again.waiting_on_count == 10_000, "presenting twice keeps the count"
    unbounded = runstatus.present(WorkflowRunStatus(phase="Running", waiting_on=many), 1)
    assert len(unbounded.waiting_on) == 20 and unbounded.waiting_on_count == 10_000


def test_the_message_is_one_short_line() -> None:
    long = RunError(type="Boom", message="x" * 5000)
    shown = runstatus.present(WorkflowRunStatus(phase="Failed", error=long), 1)
    assert len(shown.message) <= runstatus.MESSAGE_LIMIT and "\n" not in shown.message


def test_durations_read_as_kubectl_writes_them() -> None:
    assert runstatus.duration("2026-01-01T00:00:00Z", "2026-01-01T00:00:07Z") == "7s"
    assert runstatus.duration("2026-01-01T00:00:00Z", "2026-01-01T03:04:00Z") == "3h4m"
    assert runstatus.duration("2026-01-01T00:00:00Z", "2026-01-03T05:00:00Z") == "2d5h"
    assert runstatus.duration(None, "2026-01-01T00:00:00Z") is None


def test_labels_name_deployment_revision_and_phase_and_change_only_what_differs() -> None:
    status = WorkflowRunStatus(phase="Running", revision="shop-abc123")
    wanted = runstatus.labels("shop", status)
    assert wanted == {
        "treadle.dev/deployment": "shop", "treadle.dev/revision": "shop-abc123",
        "treadle.dev/phase": "Running",
    }  # fmt: skip
    body = {"metadata": {"labels": {"app": "x", "treadle.dev/deployment": "shop"}}}
    assert runstatus.label_patch(body, wanted) == {
        "treadle.dev/revision": "shop-abc123", "treadle.dev/phase": "Running"
    }  # fmt: skip
    assert runstatus.labels("d" * 70, status)["treadle.dev/deployment"] is None
    assert runstatus.label_patch({"metadata": {}}, {"treadle.dev/revision": None}) == {}


def test_record_output_false_keeps_the_output_out_of_status() -> None:
    """Review R9: status.output is readable by anyone who may get WorkflowRuns there;
    ``spec.recordOutput: false`` writes none (the run's output stays in the World)."""
    from treadle_operator import models

    done = WorkflowRunStatus(phase="Completed", output='{"card":"4111"}')
    hidden = {"metadata": {"generation": 2}, "spec": {"recordOutput": False}}
    shown = runstatus.present_for(hidden, done)
    assert shown.output is None and shown.observed_generation == 2
    assert models.dump(shown)["output"] is None  # the merge patch removes an earlier one
    assert shown.message == "completed"
    for body in ({"metadata": {}, "spec": {}}, {"spec": {"recordOutput": True}}):
        assert runstatus.present_for(body, done).output == '{"card":"4111"}'
    assert (
        models.WorkflowRunSpec.model_validate(
            {"deployment": "d", "workflow": "w", "recordOutput": False}
        ).record_output
        is False
    )
