"""What a WorkflowRun's status says to kubectl and GitOps tools (issue 11 item 1).

Every status the operator writes on a WorkflowRun passes through ``present``:

- terminal conditions ``Succeeded`` and ``Failed``: ``Unknown`` while the run
  goes on, then exactly one of them ``True`` with the reason and message, so
  ``kubectl wait --for=condition=Succeeded wfr/x`` (or ``=Failed``) returns
  when the run ends. A cancelled run is ``Failed``, reason ``Cancelled``.
- ``observedGeneration``, on the status and on every condition;
- ``message``, one short line (``kubectl get wfr`` shows it), and
  ``duration`` once the run ended;
- ``waitingOn`` bounded to the first ``WAITING_ON_LIMIT`` entries, with
  ``waitingOnCount`` the full number (review R6).

``present_for`` is ``present`` for an object: its generation, and its
``spec.recordOutput`` (false: ``status.output`` is never written, review R9).
``labels`` gives the object's ``treadle.dev/deployment``, ``/revision`` and
``/phase`` labels (``kubectl get wfr -l treadle.dev/phase=Failed``). Callers:
``runs`` (start, refusals, waiting) and ``sync`` (status from the log).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from treadle_operator.conditions import condition, merge_conditions
from treadle_operator.models import Condition, WorkflowRunStatus

WAITING_ON_LIMIT = 20
MESSAGE_LIMIT = 120
TERMINAL = ("Succeeded", "Failed")
LABEL_DEPLOYMENT = "treadle.dev/deployment"
LABEL_REVISION = "treadle.dev/revision"
LABEL_PHASE = "treadle.dev/phase"
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_STAMP = "%Y-%m-%dT%H:%M:%SZ"


def bound_waiting(waiting: list[str]) -> tuple[list[str], int]:
    """The first ``WAITING_ON_LIMIT`` entries and how many there are in all."""
    return waiting[:WAITING_ON_LIMIT], len(waiting)


def duration(started: str | None, completed: str | None) -> str | None:
    """``1h2m``, ``3m4s``, ``5s``: kubectl's way of writing a span; ``None`` if unknown."""
    if not started or not completed:
        return None
    try:
        begin = datetime.strptime(started, _STAMP).replace(tzinfo=UTC)
        end = datetime.strptime(completed, _STAMP).replace(tzinfo=UTC)
    except ValueError:
        return None
    seconds = max(0, int((end - begin).total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def _short(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MESSAGE_LIMIT else line[: MESSAGE_LIMIT - 3] + "..."


def message(status: WorkflowRunStatus) -> str:
    """One line on where the run is."""
    if status.phase == "Completed":
        return "completed" + (f" in {status.duration}" if status.duration else "")
    if status.phase in ("Failed", "Cancelled"):
        if status.error is not None:
            return _short(f"{status.error.type}: {status.error.message}")
        return _short(f"{status.phase.lower()}: {status.reason}" if status.reason else "")
    if status.waiting_on:
        more = status.waiting_on_count - 1
        return _short(f"waiting on {status.waiting_on[0]}" + (f" (+{more} more)" if more else ""))
    started = next((c for c in status.conditions if c.type == "Started"), None)
    if status.phase == "Pending" and started is not None and started.status == "False":
        return _short(started.message or started.reason)
    if status.phase == "Running":
        return f"{status.steps.running} steps running" if status.steps.running else "running"
    return _short(status.reason)


def terminal_conditions(status: WorkflowRunStatus) -> list[Condition]:
    """``Succeeded`` and ``Failed`` for the status's phase."""
    text = message(status)
    if status.phase == "Completed":
        return [
            condition("Succeeded", True, "Completed", text),
            condition("Failed", False, "Completed"),
        ]
    if status.phase in ("Failed", "Cancelled"):
        reason = "Cancelled" if status.phase == "Cancelled" else (status.reason or "Failed")
        return [
            condition("Succeeded", False, reason),
            condition("Failed", True, reason, text),
        ]
    waiting = status.reason or status.phase
    return [
        Condition(type=kind, status="Unknown", reason=waiting, message="the run has not ended")
        for kind in TERMINAL
    ]


def records_output(body: dict[str, Any]) -> bool:
    """Whether the object asks for its run's output in status (``spec.recordOutput``)."""
    return (body.get("spec") or {}).get("recordOutput") is not False


def present_for(body: dict[str, Any], status: WorkflowRunStatus) -> WorkflowRunStatus:
    """``present`` for the object ``body``: its generation and its ``spec.recordOutput``."""
    generation = (body.get("metadata") or {}).get("generation")
    return present(status, generation, record_output=records_output(body))


def present(
    status: WorkflowRunStatus, generation: int | None, *, record_output: bool = True
) -> WorkflowRunStatus:
    """The status as written: bounded, with its message, duration and terminal conditions
    (without ``output`` when not ``record_output``)."""
    if not record_output and status.output is not None:
        status = status.model_copy(update={"output": None})
    finished = status.phase in ("Completed", "Failed", "Cancelled")
    waiting, count = list(status.waiting_on), status.waiting_on_count
    if len(waiting) > WAITING_ON_LIMIT or count < len(waiting):
        waiting, count = bound_waiting(waiting)
    shaped = status.model_copy(
        update={
            "waiting_on": [] if finished else waiting,
            "waiting_on_count": 0 if finished else count,
            "duration": duration(status.started_at, status.completed_at) if finished else None,
            "observed_generation": generation,
        }
    )
    shaped = shaped.model_copy(update={"message": message(shaped)})
    made = merge_conditions(shaped.conditions, terminal_conditions(shaped))
    others = [c for c in shaped.conditions if c.type not in TERMINAL]
    conditions = [
        c.model_copy(update={"observed_generation": generation}) for c in [*others, *made]
    ]
    return shaped.model_copy(update={"conditions": conditions})


def labels(spec_deployment: str, status: WorkflowRunStatus) -> dict[str, str | None]:
    """The object's treadle labels for this status (``None`` removes one)."""
    wanted: dict[str, str | None] = {
        LABEL_DEPLOYMENT: spec_deployment,
        LABEL_REVISION: status.revision,
        LABEL_PHASE: status.phase,
    }
    return {
        key: value if value is None or (len(value) <= 63 and _LABEL_VALUE.match(value)) else None
        for key, value in wanted.items()
    }


def label_patch(body: dict[str, Any], wanted: dict[str, str | None]) -> dict[str, str | None]:
    """What must change on the object's labels to have ``wanted`` (empty: nothing)."""
    have = (body.get("metadata") or {}).get("labels") or {}
    return {
        k: v for k, v in wanted.items() if have.get(k) != v and not (v is None and k not in have)
    }
