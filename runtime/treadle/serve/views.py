"""What the serve API shows of a run, folded from its record and its log (pure functions).

``summary``/``detail`` from a ``RunRecord`` (and the log, for what it waits on),
``event_out`` one logged event, ``timeline`` the steps, sleeps and hooks as bars
with their attempts. Nothing here reads the World: ``serve.api`` reads it through
the contract and hands the records in, so every rule is a unit test away.

Hook tokens resume a hook without further auth (``POST /hooks/{token}``), so they
are hidden (``HIDDEN``) unless the caller has the full role (``show_tokens``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from treadle import childtree, limitview, payloads
from treadle.serve import models
from treadle.world import events, records

HIDDEN = "<hidden>"
TOKEN_EVENTS = frozenset({"hook_created", "hook_conflict"})
Outcome = Literal["running", "completed", "failed", "retrying", "superseded"]


def _ms(start: datetime | None, end: datetime | None) -> int | None:
    if start is None or end is None:
        return None
    return max(0, int((end - start).total_seconds() * 1000))


def summary(run: records.RunRecord) -> models.RunSummary:
    ended = run.completed_at if run.is_terminal else None
    if run.is_terminal and ended is None:
        ended = run.updated_at
    return models.RunSummary(
        run_id=run.run_id,
        workflow=run.workflow_name,
        status=run.status,
        deployment_id=run.deployment_id,
        spec_version=run.spec_version,
        created_at=run.created_at,
        started_at=run.started_at,
        ended_at=ended,
        updated_at=run.updated_at,
        duration_ms=_ms(run.started_at or run.created_at, ended),
        attributes=dict(run.attributes),
        waiting_on_limit=limitview.waiting_dict(run.waiting_on_limit),
    )


def _error(error: events.ErrorInfo | None) -> models.RunError | None:
    if error is None:
        return None
    return models.RunError(
        type=error.type, message=error.message, code=error.code, stack=error.stack
    )


def detail(
    run: records.RunRecord,
    log: Sequence[events.LoggedEvent],
    *,
    show_tokens: bool,
    keys: payloads.KeyRing | None,
) -> models.RunDetail:
    return models.RunDetail(
        **summary(run).model_dump(exclude={"attributes"}),
        input=payloads.display(run.input, keys),
        output=payloads.display(run.output, keys),
        error=_error(run.error),
        attributes=payloads.display(run.attributes, keys),
        event_count=run.seq,
        waiting_on=[] if run.is_terminal else waiting_on(log, show_tokens=show_tokens),
    )


def tree_fields(family: childtree.RunTree) -> dict[str, Any]:
    """The run detail's child-workflow fields: its parent link, its children."""
    return {
        "parent_run_id": family.parent_run_id,
        "parent_correlation_id": family.parent_correlation_id,
        "children": [models.ChildOut(**c.as_dict()) for c in family.children],
    }


def event_out(
    event: events.LoggedEvent, *, show_tokens: bool, keys: payloads.KeyRing | None
) -> models.EventOut:
    body: BaseModel = event.event
    data: dict[str, Any] = payloads.display(body.model_dump(mode="json"), keys)
    if event.type in TOKEN_EVENTS and not show_tokens:
        data["token"] = HIDDEN
    return models.EventOut(
        slot=event.slot,
        created_at=event.created_at,
        type=event.type,
        correlation_id=event.correlation_id,
        in_band=event.in_band,
        event=data,
    )


@dataclass
class _Bar:
    id: str
    kind: Literal["step", "wait", "hook"]
    name: str
    start: datetime
    inline: bool = False
    end: datetime | None = None
    status: str = "created"
    since: datetime | None = None
    until: datetime | None = None
    token: str | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)

    def open_attempt(self) -> dict[str, Any] | None:
        if self.attempts and self.attempts[-1]["outcome"] == "running":
            return self.attempts[-1]
        return None

    def close(self, at: datetime, outcome: Outcome, error: str | None = None) -> None:
        current = self.open_attempt()
        if current is not None:
            current.update(ended_at=at, outcome=outcome, error=error)


@dataclass
class _Fold:
    bars: dict[str, _Bar] = field(default_factory=dict)
    refusals: int = 0
    handoffs: int = 0


def _error_text(error: events.ErrorInfo) -> str:
    return f"{error.type}: {error.message}"


def _step(fold: _Fold, logged: events.LoggedEvent) -> None:
    body, at = logged.event, logged.created_at
    cid = logged.correlation_id or ""
    bar = fold.bars.get(cid)
    name = getattr(body, "step_name", "step")
    if bar is None:
        bar = fold.bars[cid] = _Bar(cid, "step", name, at, since=at)
    match body:
        case events.StepCreated(inline=inline):
            bar.inline = bar.inline or inline
        case events.StepStarted(attempt=attempt, inline=inline):
            bar.inline = bar.inline or inline
            if bar.open_attempt() is not None:
                bar.close(at, "superseded")
                fold.handoffs += 1
            bar.attempts.append(
                {"attempt": attempt, "started_at": at, "ended_at": None, "outcome": "running"}
            )
            bar.status, bar.since = "running", at
        case events.StepRetrying(error=error, creator_message_id=moved):
            bar.close(at, "retrying", _error_text(error))
            bar.status, bar.since = "retrying", at
            if moved is not None:
                fold.handoffs += 1
        case events.StepCompleted():
            bar.close(at, "completed")
            bar.status, bar.end = "completed", at
        case events.StepFailed(error=error):
            bar.close(at, "failed", _error_text(error))
            bar.status, bar.end = "failed", at


def _wait_or_hook(fold: _Fold, logged: events.LoggedEvent) -> None:
    body, at = logged.event, logged.created_at
    cid = logged.correlation_id or ""
    bar = fold.bars.get(cid)
    match body:
        case events.WaitCreated(resume_at=resume_at):
            fold.bars[cid] = _Bar(
                cid, "wait", f"sleep until {resume_at.isoformat()}", at,
                status="waiting", since=at, until=resume_at,
            )  # fmt: skip
        case events.WaitCompleted() if bar is not None:
            bar.status, bar.end = "completed", at
        case events.HookCreated(token=token):
            fold.bars[cid] = _Bar(cid, "hook", "hook", at, status="waiting", since=at, token=token)
        case events.HookConflict(token=token):
            fold.bars[cid] = _Bar(cid, "hook", "hook", at, end=at, status="conflict", token=token)
            fold.refusals += 1
        case events.HookReceived() if bar is not None:
            bar.status, bar.end = "received", at
        case events.HookDisposed() if bar is not None:
            bar.end = bar.end or at
            if bar.status == "waiting":
                bar.status = "disposed"


_HOOK_OR_WAIT = events.WAIT_TYPES | frozenset(
    {"hook_created", "hook_received", "hook_disposed", "hook_conflict"}
)


def _fold(log: Sequence[events.LoggedEvent]) -> _Fold:
    fold = _Fold()
    for logged in log:
        if logged.type in events.STEP_TYPES:
            _step(fold, logged)
        elif logged.type in _HOOK_OR_WAIT:
            _wait_or_hook(fold, logged)
    return fold


def waiting_on(log: Sequence[events.LoggedEvent], *, show_tokens: bool) -> list[models.WaitingOn]:
    """The steps not ended, the sleeps not completed and the hooks not received."""
    found: list[models.WaitingOn] = []
    for bar in _fold(log).bars.values():
        if bar.end is not None:
            continue
        attempt = bar.attempts[-1]["attempt"] if bar.attempts else None
        found.append(
            models.WaitingOn(
                kind=bar.kind,
                id=bar.id,
                name=bar.name if bar.kind == "step" else None,
                since=bar.since or bar.start,
                until=bar.until,
                attempt=attempt if bar.kind == "step" else None,
                inline=bar.inline if bar.kind == "step" else None,
                status=bar.status,
                token=(bar.token if show_tokens else HIDDEN) if bar.kind == "hook" else None,
            )
        )
    return found


def timeline(run: records.RunRecord, log: Sequence[events.LoggedEvent]) -> models.Timeline:
    fold = _fold(log)
    ended = summary(run).ended_at
    bars = [
        models.TimelineBar(
            id=bar.id,
            kind=bar.kind,
            name=bar.name,
            inline=bar.inline,
            attempts=[models.Attempt(**a) for a in bar.attempts],
            start=bar.start,
            end=bar.end,
            status=bar.status,
        )
        for bar in fold.bars.values()
    ]
    return models.Timeline(
        run_id=run.run_id,
        status=run.status,
        start=run.started_at or run.created_at,
        end=ended,
        bars=bars,
        refusals=fold.refusals,
        handoffs=fold.handoffs,
    )
