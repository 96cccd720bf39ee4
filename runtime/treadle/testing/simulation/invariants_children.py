"""The invariants of child workflows (``gen_children``), checked on what the World ends
with: every parent run's children, their records and logs.

- ``child_outcome_twice``: a child's outcome is in its parent's log at most once.
- ``child_outcome_lost``: a child that ended (more than ``SETTLE_SECONDS`` before the
  cut) has its outcome in its parent's log, and it is the child's own (completed with
  its output, failed, or cancelled).
- ``child_never_created``: a ``child_created`` of a parent that had not ended has its
  child run, linked back to the parent (record and ``run_created``).
- ``child_orphan``: under ``on_parent_close="cancel"`` no child outlives its ended
  parent (by more than ``SETTLE_SECONDS``).
- ``child_unknown_outcome``: no outcome names a child the log never created.
- ``child_missing``: a completed parent's log holds one ``child_created`` per child op.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from treadle import errors
from treadle.sdk import functions
from treadle.testing.simulation.invariants import RunOutcome, Violation
from treadle.testing.simulation.loop import EPOCH
from treadle.testing.simulation.workload import Program
from treadle.world import events, records

# Virtual seconds an end may take to reach the parent (a wake, a redelivery's repair).
SETTLE_SECONDS = 45.0


@dataclass
class Checked:
    violations: list[Violation] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)


def _ended_at(log: Sequence[events.LoggedEvent]) -> float | None:
    """Loop time of the log's terminal event, if any."""
    for logged in log:
        if logged.type in events.RUN_TERMINAL_TYPES:
            return logged.created_at.timestamp() - EPOCH
    return None


def _matches(record: records.RunRecord, outcome: events.Event) -> bool:
    if isinstance(outcome, events.ChildCompleted):
        return record.status == "completed" and outcome.output == record.output
    if isinstance(outcome, events.ChildFailed):
        if outcome.cancelled:
            return record.status == "cancelled"
        return record.status == "failed"
    return False


Collect = Callable[[str, Program, tuple[float, float]], Awaitable[RunOutcome]]


async def collect(parent: RunOutcome, backend: Any, make: Collect) -> dict[str, RunOutcome]:
    """Child op id -> its child run, as a run of its own (``make``: the runner's
    ``_collect``, over the child's life, its body steps as its program), for the
    parent's checks (``invariants._check_child``, ``invariants._as_children_logged``)."""
    found: dict[str, RunOutcome] = {}
    for logged in parent.log:
        event = logged.event
        if not isinstance(event, events.ChildCreated):
            continue
        try:
            args, _ = functions.decode_arguments(event.input)
            body = list(args[0])
            log = backend.events_of(event.child_run_id)
        except (errors.RunNotFound, errors.SerializationError, IndexError, TypeError):
            continue  # never created (child_never_created judges that), or no body
        if not body or not log:
            continue
        op_id = str(body[0]["id"]).rsplit("s", 1)[0]  # gen_children: step k<n>s<j>
        ended = _ended_at(log)
        span = (log[0].created_at.timestamp() - EPOCH, float("inf") if ended is None else ended)
        child = await make(event.child_run_id, Program(ops=body, actors=[]), span)
        # Cancelled with its parent (on_parent_close="cancel") or by its cancel: its
        # running bodies are cancelled by the rule, as a cancelled run's own are.
        cancelled = child.record is not None and child.record.status == "cancelled"
        child.cancelled_by_actor = parent.cancelled_by_actor or cancelled
        found[op_id] = child
    return found


def check(outcomes: Sequence[RunOutcome], backend: Any) -> Checked:
    """Every parent's children against the invariants above."""
    out = Checked()
    for o in outcomes:
        if o.spec_version < 9:
            continue
        _check_parent(o, backend, out)
    return out


def _check_parent(o: RunOutcome, backend: Any, out: Checked) -> None:
    rid = o.run_id
    created: dict[str, events.ChildCreated] = {}
    reported: dict[str, list[events.Event]] = {}
    for logged in o.log:
        event = logged.event
        if isinstance(event, events.ChildCreated):
            created[event.correlation_id] = event
        elif isinstance(event, events.ChildCompleted | events.ChildFailed):
            reported.setdefault(event.correlation_id, []).append(event)
    parent_end = _ended_at(o.log)
    calls = sum(1 for op in o.program.ops if op["k"] == "child")
    if o.record is not None and o.record.status == "completed" and len(created) != calls:
        # A completed parent reached every op: each child op made one child_created (one
        # started last and never awaited too: ``orchestrator.children.before_end``).
        out.violations.append(
            Violation("child_missing", rid, f"{calls} child calls, {len(created)} created")
        )
    cut = o.cut_at if o.cut_at is not None else float("-inf")  # no cut: no settled end
    for cid, found in reported.items():
        if len(found) > 1:
            out.violations.append(
                Violation("child_outcome_twice", rid, f"{len(found)} outcomes for child {cid}")
            )
        if cid not in created:
            out.violations.append(
                Violation("child_unknown_outcome", rid, f"an outcome for child {cid} never created")
            )
    for cid, child in created.items():
        try:
            record = backend.run_record(child.child_run_id)
            log = backend.events_of(child.child_run_id)
        except errors.RunNotFound:
            if parent_end is None:
                out.violations.append(
                    Violation("child_never_created", rid, f"child {child.child_run_id} ({cid})")
                )
            continue
        out.trace.append(f"child {rid} {child.child_run_id} " + " ".join(
            f"{e.slot}:{e.type}" for e in log
        ))  # fmt: skip
        first = log[0].event
        links = (record.parent_run_id, record.parent_correlation_id)
        logged_links = (getattr(first, "parent_run_id", None),
                        getattr(first, "parent_correlation_id", None))  # fmt: skip
        if links != (rid, cid) or logged_links != (rid, cid):
            out.violations.append(
                Violation("child_link", rid, f"child {child.child_run_id} links to {links}")
            )
        child_end = _ended_at(log)
        got = reported.get(cid, [])
        if child_end is not None and child_end < cut - SETTLE_SECONDS:
            if not got:
                out.violations.append(
                    Violation(
                        "child_outcome_lost",
                        rid,
                        f"child {child.child_run_id} {record.status} at {child_end:.1f} s; "
                        "no outcome in its parent's log",
                    )
                )
            elif not _matches(record, got[0]):
                out.violations.append(
                    Violation(
                        "child_outcome_wrong",
                        rid,
                        f"child {child.child_run_id} is {record.status}; "
                        f"the parent heard {got[0].type}",
                    )
                )
        if (
            child.on_parent_close == "cancel"
            and parent_end is not None
            and parent_end < cut - SETTLE_SECONDS
            and not record.is_terminal
        ):
            out.violations.append(
                Violation(
                    "child_orphan",
                    rid,
                    f"child {child.child_run_id} still {record.status}; its parent ended at "
                    f"{parent_end:.1f} s (on_parent_close=cancel)",
                )
            )
