"""The invariants of the simulation's limit workload (``gen_limits``; issue 17 item 4).

From the runs' logs (times are the World's virtual clock):

- ``limit_concurrency``: per key, at no instant more than ``max`` runs between their
  ``run_started`` and their end (a run holds its slot from before its start to after its
  end, so the log's intervals nest inside the holdings);
- ``limit_step_concurrency``: per step key, at no instant more than ``step_max`` step
  attempts between a ``step_started`` and the attempt's end (its retry, outcome, next
  start or its run's end: a run's end frees its steps' slots);
- ``limit_rate``: per key, the k-th start no earlier than the first start plus k
  intervals (burst 1);
- ``limit_waiter``: every limited run ended, completed with its output, or cancelled by
  the plan (a waiter that never ran is a lost wake);
- ``limit_world``: the memory World never held more than ``max`` holders of one key.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

from treadle import serde
from treadle.sdk import functions
from treadle.testing.memory import MemoryBackend
from treadle.testing.simulation.gen_limits import STEP, WORKFLOW, LimitRuns
from treadle.testing.simulation.invariants import Violation
from treadle.world import events, limitrules, records

TERMINAL = ("run_completed", "run_failed", "run_cancelled")
ATTEMPT_ENDS = ("step_retrying", "step_completed", "step_failed", "step_started")
EPSILON = 0.002


def _seconds(at: datetime) -> float:
    return at.timestamp()


def _most_at_once(intervals: Sequence[tuple[float, float]]) -> tuple[int, float]:
    """The most intervals open at one instant, and when (an end before a start at a tie)."""
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    most, at, now = 0, 0.0, 0
    for when, step in edges:
        now += step
        if now > most:
            most, at = now, when
    return most, at


def _end(log: Sequence[events.LoggedEvent]) -> float:
    ended = [_seconds(e.created_at) for e in log if e.type in TERMINAL]
    return min(ended) if ended else float("inf")


def _step_attempts(
    log: Sequence[events.LoggedEvent], run_end: float
) -> list[tuple[str, float, float]]:
    """(step key, start, end) of each attempt of the limited step in one run's log."""
    keys: dict[str, str] = {}
    out: list[tuple[str, float, float]] = []
    open_at: dict[str, float] = {}
    for e in log:
        cid = e.correlation_id or ""
        if isinstance(e.event, events.StepCreated) and e.event.step_name == STEP:
            args, _ = functions.decode_arguments(e.event.input)
            keys[cid] = str(args[0])
        if cid not in keys:
            continue
        at = _seconds(e.created_at)
        if e.type in ATTEMPT_ENDS and cid in open_at:
            out.append((keys[cid], open_at.pop(cid), min(at, run_end)))
        if e.type == "step_started":
            open_at[cid] = at
    out += [(keys[cid], start, run_end) for cid, start in open_at.items()]
    return [(k, s, e) for k, s, e in out if e >= s]


def check(
    backend: MemoryBackend, limited: LimitRuns, recs: dict[str, records.RunRecord]
) -> list[Violation]:
    plan = limited.plan
    violations: list[Violation] = []
    runs_by_key: dict[str, list[tuple[float, float]]] = defaultdict(list)
    steps_by_key: dict[str, list[tuple[float, float]]] = defaultdict(list)
    starts_by_key: dict[str, list[float]] = defaultdict(list)
    for run, handle in limited.started:
        rec = recs[handle.run_id]
        log = list(backend.events_of(handle.run_id))
        end = _end(log)
        started = [_seconds(e.created_at) for e in log if e.type == "run_started"]
        if started and started[0] <= end:
            runs_by_key[run.key].append((started[0], end))
            starts_by_key[run.key].append(started[0])
        for key, s, e in _step_attempts(log, end):
            steps_by_key[key].append((s, e))
        if rec.status == "completed":
            output = serde.decode(rec.output, "limited output")
            if output != plan.expected(run):
                violations.append(
                    Violation("limit_waiter", handle.run_id, f"output {output!r}, expected "
                              f"{plan.expected(run)!r}")
                )  # fmt: skip
        elif not (rec.status == "cancelled" and run.cancel_at is not None):
            violations.append(
                Violation("limit_waiter", handle.run_id, f"ended {rec.status} (never admitted?)")
            )
    if len(limited.started) != len(plan.runs):
        violations.append(
            Violation("limit_waiter", None, f"{len(limited.started)} of {len(plan.runs)} started")
        )
    for key, intervals in runs_by_key.items():
        most, at = _most_at_once(intervals)
        if most > plan.max:
            violations.append(
                Violation("limit_concurrency", None, f"key {key!r}: {most} runs at {at:.3f}")
            )
    for key, intervals in steps_by_key.items():
        most, at = _most_at_once(intervals)
        if most > plan.step_max:
            violations.append(
                Violation("limit_step_concurrency", None, f"key {key!r}: {most} at {at:.3f}")
            )
    if plan.rate_ms is not None and limited.first_start is not None:
        for key, starts in starts_by_key.items():
            for k, at in enumerate(sorted(starts)):
                due = limited.first_start + k * plan.rate_ms / 1000
                if at < due - EPSILON:
                    violations.append(
                        Violation("limit_rate", None, f"key {key!r}: start {k} at {at:.3f}, "
                                  f"before {due:.3f}")
                    )  # fmt: skip
    for (scope, key), peak in backend.limits.peak.items():
        most = plan.max if scope == limitrules.workflow_scope(WORKFLOW) else plan.step_max
        if peak > most:
            violations.append(Violation("limit_world", None, f"{scope} {key!r}: {peak} holders"))
    return violations
