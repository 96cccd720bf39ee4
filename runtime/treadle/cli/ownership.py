"""``treadle inspect`` on a spec 8 run: who owns each inline step, and when its backstop
wake comes due (issue 12 item 6; seed 000 "What this change does", "The dispatch
decision table").

For each inline step (one created by a lazy inline ``step_started``) the log alone
says, as every replayer derives it (``ownership.fold_ownership``): its ownership
phase, the owning queue message id (for an ended step, the message whose stamped start
ran its body last), and, while it is owned, when the delayed backstop
wake a non-owner arms comes due (the latest ``step_started`` plus the lease, from
``WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS`` of the inspecting process) and its
epoch-scoped key (``ownership.backstop_key``). Spec 9 runs have no inline ownership:
``inline_ownership`` returns None for them and ``inspect`` prints them unchanged.

Called by ``treadle.cli.manage.cmd_inspect``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from treadle.cli import output
from treadle.orchestrator.spec8 import ownership
from treadle.world import events, records, specversions


def inline_step_ids(timeline: Sequence[events.LoggedEvent]) -> list[str]:
    """The correlation ids of the run's inline steps, in the order they were created."""
    found: list[str] = []
    for logged in timeline:
        body = logged.event
        cid = logged.correlation_id
        if isinstance(body, events.StepStarted) and body.inline and cid and cid not in found:
            found.append(cid)
    return found


def inline_ownership(
    run: records.RunRecord,
    timeline: Sequence[events.LoggedEvent],
    *,
    lease_seconds: float,
    now: datetime,
) -> list[dict[str, Any]] | None:
    """One row per inline step of a spec 8 run; None for a run of another format."""
    if specversions.orchestrator_for(run.spec_version) is not specversions.Family.SPEC8:
        return None
    rows: list[dict[str, Any]] = []
    for cid in inline_step_ids(timeline):
        state = ownership.fold_ownership(timeline, cid)
        name = next(
            (
                output.step_name(e)
                for e in timeline
                if e.correlation_id == cid and output.step_name(e)
            ),
            None,
        )
        starts = [
            e.event
            for e in timeline
            if e.correlation_id == cid and isinstance(e.event, events.StepStarted)
        ]
        row: dict[str, Any] = {
            "correlation_id": cid,
            "step_name": name,
            "phase": state.phase.value,
            "owner_message_id": state.owner_message_id,
            # The latest start's stamp, whatever the phase: who ran (or runs) the body.
            "last_start_owner_message_id": starts[-1].owner_message_id if starts else None,
            "last_started_at": output.iso(state.last_started_at),
            "lapsed": state.lapsed,
            "backstop_due_at": None,
            "backstop_key": None,
            "lease_expired": None,
        }
        if state.phase is ownership.Phase.OWNED and state.last_started_at is not None:
            due = state.last_started_at + timedelta(seconds=lease_seconds)
            row["backstop_due_at"] = output.iso(due)
            row["backstop_key"] = ownership.backstop_key(cid, state.last_started_at)
            row["lease_expired"] = now >= due
        rows.append(row)
    return rows


def print_inline_ownership(rows: Sequence[dict[str, Any]], lease_seconds: float) -> None:
    """The table ``inspect`` prints after a spec 8 run's timeline."""
    output.out("")
    if not rows:
        output.out("inline steps (spec 8 ownership): none")
        return
    output.out(f"inline steps (spec 8 ownership, lease {lease_seconds:g} s):")
    output.table(
        ["CORRELATION ID", "STEP", "PHASE", "OWNER MESSAGE", "BACKSTOP DUE (UTC)", "BACKSTOP KEY"],
        [
            [
                r["correlation_id"],
                r["step_name"] or "-",
                r["phase"] + (" (lease over)" if r["lease_expired"] else ""),
                _owner_cell(r),
                r["backstop_due_at"] or "-",
                r["backstop_key"] or "-",
            ]
            for r in rows
        ],
    )


def _owner_cell(row: dict[str, Any]) -> str:
    """The owner; for an ended step, the message whose start ran its body last."""
    if row["owner_message_id"]:
        return str(row["owner_message_id"])
    last = row["last_start_owner_message_id"]
    if row["phase"] == ownership.Phase.TERMINAL.value and last:
        return f"{last} (ran it)"
    return "-"
