"""Which known engine bug a violation most likely shows (engine-audit.md sections 5, 6;
for a spec 8 run, which seed 000 rule it breaks).

``classify(violation, report)`` returns a short label ("bug 1", "bug 6", ...) or
"unknown", from the violation's kind and the program that produced it. It is a
heuristic for triage and for ``tests/testing/found_seeds.md``, not a proof; the
replay command and the trace are the evidence. Used by ``__main__`` and the tests.
"""

from __future__ import annotations

from treadle.testing.simulation.invariants import Violation
from treadle.testing.simulation.runner import Report


def _repeated_token(report: Report) -> bool:
    for program in report.programs:
        tokens = [op["token"] for op in program.ops if op["k"] in ("hook", "race_hook")]
        if len(tokens) != len(set(tokens)):
            return True
    return False


_SPEC8 = {
    "duplicate_inline": "#2780 (a wake ran an owned inline body again inside its lease)",
    "single_flight": "single-flight (two bodies of one step at once in one process)",
    "at_most_once": "seed 000 at-most-once (a max_retries=0 body ran twice)",
    "exhausted_live": "seed 000 dispatch (failed as exhausted under a live owner, in lease)",
    "wedge": "wedge (no message left: the lease and backstop did not recover)",
    "never_ended": "spec 8 never ended (messages left; a wake or backstop loop?)",
    "overlap": "spec 8 step message overlap (queue lease held)",
}


def classify(v: Violation, report: Report) -> str:
    d = v.detail
    if v.run_id is not None and v.run_id in report.spec8_run_ids:
        return _SPEC8.get(v.kind, f"spec 8 {v.kind}")
    if v.kind == "loop_held":
        return "bug 4 (spin with no free inline slot)"
    if v.kind == "output" and "HookConflictError" in d and _repeated_token(report):
        return "bug 6 (hook not disposed after its payload)"
    if v.kind in ("overlap", "at_most_once"):
        return "bug 1 / F1 (inline retry re-run inline while its background attempt runs)"
    if v.kind == "exhausted_unrun":
        return (
            "bug 1 / F1 (exhausted while attempt runs)"
            if "still ran" in d
            else "bug 3 (inline body never started)"
        )
    if v.kind == "unstarted_body":
        return "optimistic start of a max_retries=0 step (orchestrator.turbo)"
    if v.kind == "cancelled_body":
        return "bug 2 (error cancels running inline bodies)"
    if v.kind == "log" and "second outcome" in d:
        return "F2 / bug 1 (a second step outcome)"
    if v.kind == "output" and d.startswith("step ") and "expected completed" in d:
        return "bug 1 or 3 (a step failed that should complete)"
    if v.kind == "output" and "StepAttemptsExhausted" in d:
        return "bug 1 or 3 (false StepAttemptsExhausted)"
    return "unknown"


def labels(report: Report) -> list[str]:
    return sorted({classify(v, report) for v in report.violations})
