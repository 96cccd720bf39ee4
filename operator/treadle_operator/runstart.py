"""One try at starting a WorkflowRun, for ``starts.Starts`` (review operator.md R5 (b)).

``attempt`` reads the object fresh, and starts its run (``runs.start``). When the
run cannot start yet (``runs.NotYet``) the object says why **once**: ``Started``
False with the reason (patched only when it changes, by ``runs.waiting``) and one
Warning Event ``StartBlocked`` when the reason is new, never one per try.

A WorkflowRun with ``spec.cancel`` that never started ends ``Cancelled`` here
without asking its World (which may be why it cannot start), with ``completedAt``
set, so its TTL counts from the cancel (review R13 "TTL edge").
"""

from __future__ import annotations

import logging
from typing import Any

from treadle_operator import metrics, models, runs
from treadle_operator.models import WorkflowRunSpec
from treadle_operator.state import State

log = logging.getLogger("treadle.operator.runstart")

STARTED = "Started"


async def attempt(state: State, namespace: str, name: str) -> str | None:
    """Try once; ``None`` when nothing is left to do, else why it is still blocked."""
    body = await state.kube.get(runs.PLURAL, namespace, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return None
    status = models.parse_status(models.WorkflowRunStatus, body.get("status"))
    if status.phase in models.FINISHED_PHASES:
        return None
    spec = WorkflowRunSpec.model_validate(body.get("spec") or {})
    if spec.cancel and not status.run_id:
        await runs.cancelled_before_start(state, body)
        return None
    try:
        with metrics.timed("WorkflowRun", expected=(runs.NotYet,)):
            await runs.start(state, body)
    except runs.NotYet as exc:
        await blocked(state, body, exc)
        return exc.reason
    return None


async def blocked(state: State, body: dict[str, Any], exc: runs.NotYet) -> None:
    """``Started`` False with the reason; one Warning Event when the reason is new."""
    status = models.parse_status(models.WorkflowRunStatus, body.get("status"))
    before = next((c for c in status.conditions if c.type == STARTED), None)
    await runs.waiting(state, body, exc)
    if before is None or before.status != "False" or before.reason != exc.reason:
        meta = body["metadata"]
        log.warning(
            "WorkflowRun %s/%s cannot start: %s: %s",
            meta["namespace"],
            meta["name"],
            exc.reason,
            exc,
        )
        await state.kube.event(
            body, "StartBlocked", f"{exc.reason}: {exc}; retrying with backoff", warning=True
        )
