"""Printing: JSON for ``--json`` (exactly one value on stdout), plain tables and
lines for people, and the live progress ``treadle run`` writes on stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from treadle import childtree, limitview, payloads
from treadle.world import events, records


def emit_json(value: Any) -> None:
    """One JSON value on stdout."""
    sys.stdout.write(json.dumps(value, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def out(line: str = "") -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def err(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def error_line(message: str) -> None:
    """``treadle: error: ...`` on one line (newlines in the message are folded)."""
    err("treadle: error: " + " ".join(str(message).split("\n")).strip())


def iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def short_time(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def json_text(value: Any) -> str:
    """Stored data as one line of JSON; encrypted values opened, or ``"<encrypted>"``."""
    return json.dumps(payloads.display(value), ensure_ascii=False, default=str)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Left-aligned columns, the last one unpadded."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    for cells in [list(headers), *map(list, rows)]:
        padded = [c.ljust(w) for c, w in zip(cells[:-1], widths[:-1], strict=True)]
        out("  ".join([*padded, cells[-1]]).rstrip())


def error_dict(error: events.ErrorInfo | None) -> dict[str, Any] | None:
    if error is None:
        return None
    return {"type": error.type, "message": error.message, "code": error.code}


def run_dict(run: records.RunRecord) -> dict[str, Any]:
    """A run as ``--json`` prints it; input and output as the log stores them (encrypted
    values opened where this process holds the key, else ``"<encrypted>"``)."""
    return {
        "run_id": run.run_id,
        "workflow": run.workflow_name,
        "status": run.status,
        "deployment_id": run.deployment_id,
        "spec_version": run.spec_version,
        "input": payloads.display(run.input),
        "output": payloads.display(run.output),
        "error": error_dict(run.error),
        "attributes": run.attributes,
        "created_at": iso(run.created_at),
        "started_at": iso(run.started_at),
        "completed_at": iso(run.completed_at),
        "updated_at": iso(run.updated_at),
        "waiting_on_limit": limitview.waiting_dict(run.waiting_on_limit),
    }


def status_text(run: records.RunRecord) -> str:
    """The run's status, with the limit it waits on (issue 17 item 4)."""
    if run.waiting_on_limit is None:
        return run.status
    return f"{run.status} (waiting on {run.waiting_on_limit.limit})"


def print_run(run: records.RunRecord) -> None:
    data = run_dict(run)
    for key in ("run_id", "workflow", "status", "deployment_id", "spec_version"):
        out(f"{key + ':':<15}{data[key]}")
    for key in ("created_at", "started_at", "completed_at", "updated_at"):
        if data[key] is not None:
            out(f"{key + ':':<15}{data[key]}")
    out(f"{'input:':<15}{json_text(run.input)}")
    if run.status == "completed":
        out(f"{'output:':<15}{json_text(run.output)}")
    if run.error is not None:
        out(f"{'error:':<15}{run.error.type}: {run.error.message}")
    if run.attributes:
        out(f"{'attributes:':<15}{json_text(run.attributes)}")
    if run.waiting_on_limit is not None:
        out(f"{'waiting on:':<15}{run.waiting_on_limit.describe()}")


def tree_dict(family: childtree.RunTree) -> dict[str, Any]:
    """A run's parent link and children (child workflows), as ``runs get --json`` adds."""
    return {
        "parent_run_id": family.parent_run_id,
        "parent_correlation_id": family.parent_correlation_id,
        "children": [c.as_dict() for c in family.children],
    }


def print_tree(family: childtree.RunTree) -> None:
    if family.parent_run_id is not None:
        out(f"{'parent:':<15}{family.parent_run_id} ({family.parent_correlation_id})")
    if family.children:
        out(f"{'children:':<15}{len(family.children)}")
        for child in family.children:
            policy = "" if child.on_parent_close == "cancel" else " [abandon]"
            out(f"  {child.run_id}  {child.workflow_name}  {child.status}{policy}")


def step_name(event: events.LoggedEvent) -> str | None:
    name = getattr(event.event, "step_name", None)
    return name if isinstance(name, str) else None


def attempt_of(event: events.LoggedEvent) -> int | None:
    attempt = getattr(event.event, "attempt", None)
    return attempt if isinstance(attempt, int) else None


def event_dict(event: events.LoggedEvent) -> dict[str, Any]:
    """One timeline row for ``inspect --json``, with the whole event under ``event``."""
    body = event.event
    return {
        "slot": event.slot,
        "created_at": iso(event.created_at),
        "type": event.type,
        "correlation_id": event.correlation_id,
        "step_name": step_name(event),
        "attempt": attempt_of(event),
        "in_band": event.in_band,
        "event": payloads.display(body.model_dump(mode="json"))
        if isinstance(body, BaseModel)
        else None,
    }


def event_detail(event: events.LoggedEvent) -> str:
    """A short note on what the event carries (an error, a resume time, a token)."""
    body = event.event
    error = getattr(body, "error", None)
    if isinstance(error, events.ErrorInfo):
        return f"{error.type}: {error.message}"
    if isinstance(body, events.WaitCreated):
        return f"until {short_time(body.resume_at)}"
    if isinstance(body, events.HookCreated | events.HookConflict):
        return f"token {body.token!r}"
    if isinstance(body, events.RunCreated):
        return f"{body.workflow_name} {json_text(body.input)}"
    return ""


def print_timeline(run: records.RunRecord, timeline: Sequence[events.LoggedEvent]) -> None:
    out(f"run {run.run_id} ({run.workflow_name}): {run.status}, {len(timeline)} events")
    rows = [
        [
            str(e.slot),
            short_time(e.created_at),
            e.type,
            e.correlation_id or "-",
            step_name(e) or "-",
            "-" if attempt_of(e) is None else str(attempt_of(e)),
            "in" if e.in_band else "out",
            event_detail(e),
        ]
        for e in timeline
    ]
    table(["SLOT", "TIME (UTC)", "TYPE", "CORRELATION ID", "STEP", "ATTEMPT", "BAND", ""], rows)


class Progress:
    """Lines on stderr as a run's events arrive: steps, retries, sleeps and hooks."""

    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet
        self._attempts: dict[str, int] = {}

    def show(self, event: events.LoggedEvent) -> None:
        line = self.line(event)
        if line is not None and not self.quiet:
            err(line)

    def line(self, event: events.LoggedEvent) -> str | None:
        body = event.event
        cid = event.correlation_id or ""
        match body:
            case events.RunStarted():
                return "  started"
            case events.RunCompleted():
                return "  completed"
            case events.RunFailed(error=error):
                return f"  failed: {error.type}: {error.message}"
            case events.RunCancelled(reason=reason):
                return "  cancelled" + (f": {reason}" if reason else "")
            case events.StepStarted(attempt=attempt):
                self._attempts[cid] = attempt
                return None
            case events.StepCompleted(step_name=name):
                return f"  [ok]    step {name} (attempt {self._attempts.get(cid, 1)})"
            case events.StepRetrying(step_name=name, attempt=attempt, error=error):
                return f"  [retry] step {name} (attempt {attempt}): {error.type}: {error.message}"
            case events.StepFailed(step_name=name, attempt=attempt, error=error):
                return f"  [fail]  step {name} (attempt {attempt}): {error.type}: {error.message}"
            case events.WaitCreated(resume_at=resume_at):
                return f"  [timer] due {short_time(resume_at)} UTC"
            case events.WaitCompleted():
                return "  [timer] fired"
            case events.HookCreated(token=token):
                return f"  [hook]  waiting on hook {token!r}"
            case events.HookReceived():
                return "  [hook]  payload received"
            case events.HookDisposed():
                return "  [hook]  disposed"
            case events.HookConflict(token=token, holder_run_id=holder):
                return f"  [hook]  token {token!r} is held by run {holder}"
        return None
