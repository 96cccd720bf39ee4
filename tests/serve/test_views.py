"""What the API shows of a log (serve.views, pure): attempts, superseded starts and the
handoff/refusal counts of the timeline; hidden hook tokens; redacted log paths."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from treadle.serve import views
from treadle.serve.auth import redact_path
from treadle.world import events, records

T0 = datetime(2026, 1, 1, tzinfo=UTC)
RUN = "wrun_01ARZ3NDEKTSV4RRFFQ69G5FAV"


def _log(*bodies: events.Event) -> list[events.LoggedEvent]:
    return [
        events.LoggedEvent(
            run_id=RUN, slot=i + 1, created_at=T0 + timedelta(seconds=i), in_band=True, event=b
        )
        for i, b in enumerate(bodies)
    ]


def _run(status: records.RunStatus = "running") -> records.RunRecord:
    return records.RunRecord(
        run_id=RUN, workflow_name="wf", status=status, deployment_id="local", spec_version=9,
        input=None, created_at=T0, updated_at=T0, seq=1, seq_in_band=1, started_at=T0,
    )  # fmt: skip


def test_a_restarted_attempt_supersedes_the_open_one_and_counts_a_handoff() -> None:
    """Attempt 1 started, then attempt 2 started with no outcome between (another
    delivery took the step over): attempt 1 is superseded, one handoff; attempt 2
    completes the step."""
    log = _log(
        events.StepStarted(correlation_id="s1", step_name="charge", attempt=1, inline=True),
        events.StepStarted(correlation_id="s1", step_name="charge", attempt=2),
        events.StepCompleted(correlation_id="s1", step_name="charge", result=1),
    )
    timeline = views.timeline(_run(), log)
    [bar] = timeline.bars
    assert [a.outcome for a in bar.attempts] == ["superseded", "completed"]
    assert bar.inline is True
    assert timeline.handoffs == 1
    assert timeline.refusals == 0


def test_an_inline_retry_moved_to_its_own_message_is_a_handoff() -> None:
    """step_retrying with creator_message_id (the retry handed to the step message)."""
    error = events.ErrorInfo(message="boom", type="ValueError")
    log = _log(
        events.StepStarted(correlation_id="s1", step_name="ship", attempt=1, inline=True),
        events.StepRetrying(
            correlation_id="s1",
            step_name="ship",
            attempt=1,
            error=error,
            creator_message_id="msg_1",
        ),
    )
    timeline = views.timeline(_run(), log)
    [bar] = timeline.bars
    assert bar.status == "retrying"
    assert bar.attempts[0].error == "ValueError: boom"
    assert timeline.handoffs == 1


def test_a_hook_conflict_is_a_refusal_and_tokens_hide_from_the_read_role() -> None:
    """hook_conflict counts as a refusal; waiting_on and events hide tokens unless asked."""
    log = _log(
        events.HookCreated(correlation_id="h1", token="secret-token"),
        events.HookConflict(correlation_id="h2", token="taken", holder_run_id=None),
    )
    assert views.timeline(_run(), log).refusals == 1
    [waiting] = views.waiting_on(log, show_tokens=False)
    assert (waiting.kind, waiting.token) == ("hook", views.HIDDEN)
    assert views.waiting_on(log, show_tokens=True)[0].token == "secret-token"
    hidden = views.event_out(log[0], show_tokens=False, keys=None)
    assert hidden.event["token"] == views.HIDDEN
    assert views.event_out(log[0], show_tokens=True, keys=None).event["token"] == "secret-token"


def test_an_ended_run_waits_on_nothing_and_has_a_duration() -> None:
    """A completed run: no waiting_on, ended_at its completion, duration_ms from its start."""
    run = records.RunRecord(
        run_id=RUN, workflow_name="wf", status="completed", deployment_id="local",
        spec_version=9, input=None, created_at=T0, updated_at=T0 + timedelta(seconds=3),
        seq=4, seq_in_band=4, started_at=T0 + timedelta(seconds=1),
        completed_at=T0 + timedelta(seconds=3),
    )  # fmt: skip
    log = _log(events.WaitCreated(correlation_id="w1", resume_at=T0))
    detail = views.detail(run, log, show_tokens=True, keys=None)
    assert detail.waiting_on == []
    assert detail.duration_ms == 2000


def test_log_lines_never_show_hook_tokens_or_access_tokens() -> None:
    """redact_path: the token of /hooks/... and /api/hooks/.../resume, and access_token=."""
    assert redact_path("/api/hooks/tok-1/resume") == "/api/hooks/<redacted>/resume"
    assert redact_path("/hooks/abc/def") == "/hooks/<redacted>"
    assert redact_path("/api/stream?access_token=abc&x=1") == (
        "/api/stream?access_token=<redacted>&x=1"
    )
    assert redact_path("/api/runs") == "/api/runs"
