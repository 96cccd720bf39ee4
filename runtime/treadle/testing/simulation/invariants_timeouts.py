"""The timeout invariants (issue 17 item 5; ops from ``gen_timeouts``), checked on every
spec 9 run beside ``invariants.check``:

- ``timeout_outcome``: no outcome is accepted for a timed-out attempt: a ``tstep`` whose
  body cannot end inside its limits never has a ``step_completed``; a ``step_completed``
  of a step with a start-to-close timeout has a body that returned inside it; and an
  attempt recorded as timed out (``step_retrying`` with ``StepTimedOut``) is followed
  by the next attempt's start before any ``step_completed``.
- ``timeout_verdict``: in a run no fault touched, a possible ``tstep`` completes and an
  impossible one fails with ``StepTimedOut``.
- ``run_timeout``: a run past its run timeout fails, never completes: a run with a tight
  run timeout (its first op outlives it) never completes; a run that failed with
  ``RunTimedOut`` has one run timeout wait (position -1), failed no earlier than its
  deadline, and that wait never completed before it was due; a run without a
  reachable deadline never fails with it.
"""

from __future__ import annotations

from typing import Any

from treadle.testing.simulation import gen_timeouts
from treadle.testing.simulation.invariants import RunOutcome, Violation, _op_ids
from treadle.world import events


def _tsteps(o: RunOutcome) -> dict[str, dict[str, Any]]:
    return {op["id"]: op for op in o.program.ops if op["k"] == "tstep"}


def check(o: RunOutcome) -> list[Violation]:
    if o.record is None:
        return []
    out = _check_steps(o)
    out += _check_run_timeout(o)
    return out


def _check_steps(o: RunOutcome) -> list[Violation]:
    out: list[Violation] = []
    ops = _tsteps(o)
    if not ops:
        return out
    ids = _op_ids(o.log)
    by_step: dict[str, list[events.LoggedEvent]] = {}
    for e in o.log:
        op_id = ids.get(e.correlation_id or "")
        if op_id in ops and e.correlation_id:
            by_step.setdefault(e.correlation_id, []).append(e)
    quiet = not (o.tainted or o.owner_died or o.faults_on_run or o.cancelled_by_actor)
    for cid, logged in by_step.items():
        op = ops[ids[cid]]
        timeout, _heartbeat, _ = gen_timeouts.VARIANTS[op["v"]]
        completed = [e for e in logged if e.type == "step_completed"]
        failed = [e for e in logged if e.type == "step_failed"]
        if completed and not gen_timeouts.possible(op):
            out.append(Violation("timeout_outcome", o.run_id, f"{op} completed: it cannot"))
        if completed and timeout is not None:
            in_time = [
                b
                for b in o.bodies
                if b.step_id == cid
                and b.how == "returned"
                and b.ended is not None
                and b.ended - b.started <= timeout + 1e-6
            ]
            if not in_time:
                out.append(
                    Violation(
                        "timeout_outcome",
                        o.run_id,
                        f"{op['id']} completed, but no body of it returned inside {timeout} s",
                    )
                )
        out += _after_timed_out_attempts(o, op, logged)
        ended = o.record is not None and o.record.is_terminal
        if quiet and ended and (completed or failed):
            ok = gen_timeouts.possible(op)
            if ok and not completed:
                out.append(Violation("timeout_verdict", o.run_id, f"{op} failed without faults"))
            if not ok and not (failed and failed[0].event.error.type == "StepTimedOut"):  # type: ignore[union-attr]
                out.append(
                    Violation("timeout_verdict", o.run_id, f"{op} did not fail as timed out")
                )
    return out


def _after_timed_out_attempts(
    o: RunOutcome, op: dict[str, Any], logged: list[events.LoggedEvent]
) -> list[Violation]:
    """A ``step_completed`` after an attempt recorded timed out follows a later start."""
    timed_out = [
        e.event.attempt
        for e in logged
        if isinstance(e.event, events.StepRetrying) and e.event.error.type == "StepTimedOut"
    ]
    if not timed_out:
        return []
    latest = max(timed_out)
    later_start = next(
        (
            e.slot
            for e in logged
            if isinstance(e.event, events.StepStarted) and e.event.attempt > latest
        ),
        None,
    )
    out = []
    for e in logged:
        if e.type == "step_completed" and (later_start is None or e.slot < later_start):
            out.append(
                Violation(
                    "timeout_outcome",
                    o.run_id,
                    f"{op['id']}: step_completed at slot {e.slot} with attempt {latest} timed "
                    "out and no later attempt started",
                )
            )
    return out


def _check_run_timeout(o: RunOutcome) -> list[Violation]:
    rec = o.record
    assert rec is not None
    seconds = getattr(o.program, "run_timeout", None)
    failed_timed_out = (
        rec.status == "failed" and rec.error is not None and (rec.error.type == "RunTimedOut")
    )
    if seconds is None or seconds >= gen_timeouts.LOOSE_SECONDS:
        if failed_timed_out:
            return [Violation("run_timeout", o.run_id, "failed RunTimedOut without a deadline")]
        return []
    out = []
    if seconds == gen_timeouts.TIGHT_SECONDS and rec.status == "completed":
        out.append(Violation("run_timeout", o.run_id, "completed past its run timeout"))
    if failed_timed_out:
        waits = [
            e.event
            for e in o.log
            if isinstance(e.event, events.WaitCreated) and e.event.position == -1
        ]
        ends = [e for e in o.log if e.type == "run_failed"]
        if len(waits) != 1:
            return [*out, Violation("run_timeout", o.run_id, f"{len(waits)} run timeout waits")]
        (wait,) = waits
        assert isinstance(wait, events.WaitCreated)
        if ends and ends[0].created_at < wait.resume_at:
            out.append(
                Violation(
                    "run_timeout",
                    o.run_id,
                    f"failed RunTimedOut at {ends[0].created_at}, before its deadline "
                    f"{wait.resume_at}",
                )
            )
        early = [
            e
            for e in o.log
            if e.type == "wait_completed"
            and e.correlation_id == wait.correlation_id
            and e.created_at < wait.resume_at
        ]
        if early:
            out.append(Violation("run_timeout", o.run_id, "its wait completed before it was due"))
    return out
