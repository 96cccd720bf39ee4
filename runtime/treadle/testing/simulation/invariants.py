"""The invariants checked after every simulated run (DESIGN.md section 10).

``check(outcome)`` takes what one run left behind (its record, its whole log,
its program, the step-body ledger, the faults that touched it, queue counters)
and returns ``Violation`` objects, each naming its kind:

- ``log``: ``treadle.world.logcheck`` (dense slots, one terminal event, at most
  one outcome per step, one completion per wait, the fence's arithmetic);
- ``never_ended``: the run is not terminal by the virtual-time bound;
- ``output``: output (or error type) differs from the program's fault-free
  result (``workload.expected``), or a step's outcome differs from its expected
  (a run failed on a conflict with its own hook left open by a woken
  ``race_hook`` is expected, ``workload.may_conflict_with_own_hook``);
- ``overlap``: a step body ran concurrently with itself while its owner lived
  (its process neither dead nor stalled, its delivery's lease not lapsed);
- ``at_most_once``: a ``max_retries=0`` body started twice under one live owner;
- ``stale_body``: a retryable step body started by a delivery already told that
  its lease lapsed (F3: such a delivery starts no body);
- ``lease_ignored``: an orchestrator delivery wrote after it was told its lease
  lapsed (F3: no write; recorded by ``processes.ProcessInterceptor``);
- ``exhausted_unrun``: a step failed as exhausted before any attempt's body ran
  (unless a process died meanwhile), or while one still ran (unless an owner died or
  went stale);
- ``cancelled_body``: a step body cancelled although its process did not die;
- ``deliveries`` / ``handoffs``: more than the bound for the run's size;
- ``unstarted_body``: a ``max_retries=0`` body ran for an attempt the log never
  started (such a step never starts before its start commits: ``orchestrator.turbo``);
- ``near_due_resent``: a process sent a near-due timer key (``timers.near_due_key``)
  again after a send of it had returned (each goes out once per process: the queue
  would drop the copy, but it is a round trip; only a send that raised is retried).

One residual risk is counted, never failed (``residuals``): an optimistic start
(turbo's early inline bodies, ``WORKFLOW_OPTIMISTIC_BACKGROUND_START``) runs a
body before its start commits; when that start is then refused (the run ended,
the fence refused turbo's run_started, a throttled start), the body ran with no
committed start and its outcome was discarded, and a redelivery may run it again:
``body_before_refused_start``, one per such body run (docs/turbo.md).

Checks that faults legitimately change (a killed owner may leave a
``max_retries=0`` step exhausted; the output and budgets shift) are skipped for
a run that lost an owner while it was active (``RunOutcome.tainted``); overlap
and at-most-once are then judged per pair of bodies (was the earlier one's
owner gone when the later one started?). ``loop_held`` is raised by the runner.

A child run (``gen_children``) is held to the same body and log checks; a fault on it
shifts the child output its parent records as a fault on a run shifts the run's own:
that value is then judged by the child's log (``_as_children_logged``).
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field
from typing import Any

from treadle import serde
from treadle.orchestrator import timers
from treadle.sdk import functions
from treadle.testing.simulation import gen_hookclaims
from treadle.testing.simulation.loop import EPOCH
from treadle.testing.simulation.workload import (
    BodyRun,
    DeliveryRun,
    Program,
    expected,
    may_conflict_with_own_hook,
    outcomes_expected,
)
from treadle.world import events, logcheck, records


@dataclass
class Violation:
    kind: str
    run_id: str | None
    detail: str

    def __str__(self) -> str:
        return f"[{self.kind}] run {self.run_id}: {self.detail}"


@dataclass
class RunOutcome:
    """Everything one run left behind, collected by the runner after the simulation."""

    run_id: str
    program: Program
    record: records.RunRecord | None
    log: list[events.LoggedEvent]
    bodies: list[BodyRun]
    tainted: bool
    cancelled_by_actor: bool
    deliveries: int = 0
    handoffs: int = 0
    dead_processes: set[str] = field(default_factory=set)
    # Per process: when it died (None: it did not) and its stalls (start, end).
    killed_at: dict[str, float | None] = field(default_factory=dict)
    stalls: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    # A process died while the run was active (a stale owner alone never excuses an
    # exhausted step whose body never ran: such an owner still runs a max_retries=0 body).
    owner_died: bool = False
    # World calls of this run's deliveries made after they were told their lease lapsed.
    ignored_leases: list[str] = field(default_factory=list)
    # Spec 8 runs (``invariants8``): the run's format, the ownership lease it ran under,
    # how many injected faults touched it, and the messages of it still queued at the end.
    spec_version: int = 9
    ownership_lease: float = 860.0
    faults_on_run: int = 0
    messages_left: int = 0
    # When the simulation ended (it kills every process then: a body still running is
    # cancelled by that, not by the engine; a spec 8 run may end while one still runs).
    cut_at: float | None = None
    # Every delivery of the run's messages (start, settlement, process).
    delivery_runs: list[DeliveryRun] = field(default_factory=list)
    # The run's keyed sends in order: (the sending World, i.e. process; key; returned).
    keyed_sends: list[tuple[str, str, bool]] = field(default_factory=list)
    # Child op id -> the child run it started (``gen_children``), judged as a run of its
    # own (its body steps as its program): its faults shift what the parent records.
    children: dict[str, RunOutcome] = field(default_factory=dict)


def _vt(e: events.LoggedEvent) -> float:
    return e.created_at.timestamp() - EPOCH


def _op_ids(log: list[events.LoggedEvent]) -> dict[str, str]:
    """Correlation id -> op id, from the inputs of step creations and inline starts."""
    found: dict[str, str] = {}
    for e in log:
        data: Any = getattr(e.event, "input", None)
        if e.correlation_id and data is not None and e.correlation_id not in found:
            try:
                args, _ = functions.decode_arguments(data)
                op = args[0] if args else None
                if isinstance(op, dict) and "id" in op:
                    found[e.correlation_id] = str(op["id"])
            except Exception:  # an undecodable input names no op
                continue
    return found


def check(o: RunOutcome) -> list[Violation]:
    out: list[Violation] = []
    rid = o.run_id
    if o.record is None:
        return [Violation("never_ended", rid, "the run was never recorded")]
    out += [Violation("log", rid, p) for p in logcheck.problems(o.record, o.log)]
    if not o.record.is_terminal:
        out.append(Violation("never_ended", rid, f"still {o.record.status} at the bound"))
    race_ids = {op["step"]["id"] for op in o.program.ops if op["k"] == "race"}
    out += _check_output(o, race_ids)
    out += _check_bodies(o, race_ids)
    out += [Violation("lease_ignored", rid, text) for text in o.ignored_leases]
    out += _unstarted(o)[1]
    out += _near_due_resent(o)
    for child in o.children.values():
        out += _check_child(child)
    steps = len(outcomes_expected(o.program)) + len(race_ids)
    if o.deliveries > 80 + 6 * steps:
        out.append(Violation("deliveries", rid, f"{o.deliveries} deliveries for {steps} steps"))
    if o.handoffs > 20 + 2 * steps:
        out.append(Violation("handoffs", rid, f"{o.handoffs} handoffs for {steps} steps"))
    return out


def _near_due_resent(o: RunOutcome) -> list[Violation]:
    """A near-due key a process sent again after its send of that key had returned."""
    returned: set[tuple[str, str]] = set()
    out: list[Violation] = []
    for world, key, ok in o.keyed_sends:
        if not timers.is_near_due_key(key):
            continue
        if (world, key) in returned:
            out.append(Violation("near_due_resent", o.run_id, f"{world} sent {key} again"))
        if ok:
            returned.add((world, key))
    return out


def _conflicted_with_own_open_hook(o: RunOutcome) -> bool:
    """The run failed on a ``hook_conflict`` with its own hook, as its program allows."""
    rec = o.record
    if rec is None or rec.status != "failed" or rec.error is None:
        return False
    return (
        rec.error.type == "HookConflictError"
        and may_conflict_with_own_hook(o.program)
        and any(
            isinstance(e.event, events.HookConflict) and e.event.holder_run_id == o.run_id
            for e in o.log
        )
    )


def _check_output(o: RunOutcome, race_ids: set[str]) -> list[Violation]:
    rec = o.record
    assert rec is not None
    if o.tainted or o.cancelled_by_actor or not rec.is_terminal:
        return []
    out: list[Violation] = []
    burned = _burned_attempts(o)
    if burned:
        return []  # an attempt started without its body (legit after a fault): budgets shift
    if _conflicted_with_own_open_hook(o):
        return []  # a woken race_hook left its hook open (workload.may_conflict_with_own_hook)
    status, value = expected(o.program)
    value = _as_children_logged(o, value)
    got: Any = serde.decode(rec.output) if rec.status == "completed" else None
    got = gen_hookclaims.normalize(o.program, got)  # a force-claim victim's three outcomes
    got_err = rec.error.type if rec.error is not None else None
    if rec.status != status:
        out.append(
            Violation(
                "output",
                o.run_id,
                f"{rec.status} ({got_err}), expected {status}"
                + (f" ({value})" if status != "completed" else ""),
            )
        )
    elif status == "completed" and got != value:
        out.append(Violation("output", o.run_id, f"output {got!r}, expected {value!r}"))
    want = outcomes_expected(o.program)
    ids = _op_ids(o.log)
    for e in o.log:
        if e.type in events.STEP_OUTCOME_TYPES and e.correlation_id in ids:
            op = ids[e.correlation_id]
            kind = "completed" if e.type == "step_completed" else "failed"
            if op in want and want[op] != kind:
                out.append(
                    Violation(
                        "output",
                        o.run_id,
                        f"step {op} {kind} at slot {e.slot}, expected {want[op]}",
                    )
                )
    return out


def _check_child(child: RunOutcome) -> list[Violation]:
    """A child run held to the body invariants of a run (overlap, at most once, stale
    and cancelled bodies, exhausted only after its body ran) and to the log checker; its
    output is judged through its parent's (``_as_children_logged``)."""
    out: list[Violation] = []
    if child.record is not None:
        out += [
            Violation("log", child.run_id, p) for p in logcheck.problems(child.record, child.log)
        ]
    out += _check_bodies(child, set())
    out += _unstarted(child)[1]
    out += [Violation("lease_ignored", child.run_id, text) for text in child.ignored_leases]
    return out


def _as_children_logged(o: RunOutcome, value: Any) -> Any:
    """The expected output, with the value of each child op whose child run a fault
    shifted replaced by what that child's log records.

    A fault on a child run shifts its steps' verdicts as it does a run's own (whose
    output check is then skipped: ``tainted``, ``_burned_attempts``): a step's last
    attempt whose delivery lost its lease before its outcome landed is failed by the
    redelivery as ``StepAttemptsExhausted`` (the attempts the log records are spent; the
    body ran, its verdict was lost with the lease: docs/recovery.md "What a lapse means
    for the fence"), and a body a run-ahead or turbo stop ran twice moves a failing
    step's verdicts on (sim seeds 35, 2123). The parent records the child's output, so
    it is judged by the child's log: every step's logged outcome, in the body's order.
    """
    if not isinstance(value, list) or len(value) != len(o.program.ops):
        return value
    judged = list(value)
    for i, op in enumerate(o.program.ops):
        child = o.children.get(op.get("id", "")) if op["k"] == "child" else None
        if child is None or op["mode"] == "forget" or op["fail"]:
            continue
        if child.tainted or _burned_attempts(child):
            logged = _logged_outcomes(child)
            if all(step["id"] in logged for step in op["body"]):
                judged[i] = [logged[step["id"]] for step in op["body"]]
    return judged


def _logged_outcomes(o: RunOutcome) -> dict[str, str]:
    """Op id -> ``ok:<id>`` or ``failed:<error type>``, as the run's log ended each step."""
    ids = _op_ids(o.log)
    found: dict[str, str] = {}
    for e in o.log:
        if e.type in events.STEP_OUTCOME_TYPES and e.correlation_id in ids:
            op = ids[e.correlation_id]
            err = getattr(e.event, "error", None)
            found[op] = (
                f"ok:{op}" if e.type == "step_completed" else f"failed:{err.type if err else None}"
            )
    return found


def _burned_attempts(o: RunOutcome) -> set[str]:
    """Steps whose attempts and verdicts shifted (legit after a fault): a logged start
    whose body never ran with that attempt number, or a body verdict (raised or
    returned) that never reached the log because its write failed."""
    ran = {(b.step_id, b.attempt) for b in o.bodies}
    shifted = {
        e.correlation_id
        for e in o.log
        if isinstance(e.event, events.StepStarted)
        and e.correlation_id
        and (e.correlation_id, e.event.attempt) not in ran
    }
    verdicts: dict[str, int] = {}
    for e in o.log:
        if e.correlation_id and (e.type == "step_retrying" or e.type in events.STEP_OUTCOME_TYPES):
            verdicts[e.correlation_id] = verdicts.get(e.correlation_id, 0) + 1
    bodies: dict[str, int] = {}
    for body in o.bodies:
        if body.how in ("raised", "returned"):
            bodies[body.step_id] = bodies.get(body.step_id, 0) + 1
    shifted |= {sid for sid, n in bodies.items() if n > verdicts.get(sid, 0)}
    return shifted


def _owner_lost(o: RunOutcome, a: BodyRun, until: float) -> bool:
    """Had body ``a``'s owner gone by ``until``: its process dead or stalled since the
    body started, or its delivery told that its lease lapsed?"""
    killed = o.killed_at.get(a.process)
    if killed is not None and killed <= until:
        return True
    if any(s <= until and e >= a.started for s, e in o.stalls.get(a.process, [])):
        return True
    lost = a.lease_lost_at()
    return a.lease is None or (lost is not None and lost <= until + 1e-6)  # float rounding


def _check_bodies(o: RunOutcome, race_ids: set[str]) -> list[Violation]:
    out: list[Violation] = []
    rid = o.run_id
    by_step: dict[str, list[BodyRun]] = {}
    for b in o.bodies:
        by_step.setdefault(b.step_id, []).append(b)
    retries = {}
    for op in o.program.ops:
        for c in (
            [op]
            if op["k"] == "step"
            else op.get("ops", []) or ([op["step"]] if op["k"] == "race" else [])
        ):
            retries[c["id"]] = c["r"]
    logged_starts: dict[tuple[str, int], int] = collections.Counter(
        (e.correlation_id or "", e.event.attempt)
        for e in o.log
        if isinstance(e.event, events.StepStarted)
    )
    ran_of = collections.Counter((b.step_id, b.attempt) for b in o.bodies)
    for step_id, runs in by_step.items():
        runs.sort(key=lambda b: b.started)
        op_id = runs[0].op_id
        for a, b in itertools.pairwise(runs):
            # Under faults a body may outlive its owner (its process died or stalled, or
            # its delivery's lease lapsed): then a successor may run the step again. A
            # lease can also lapse with no fault the simulation records as an ownership
            # loss (the run is not ``tainted``): renewals that fail on ``queue_error`` at
            # ``queue.renew`` until the lease runs out (seed 137). The body's own delivery
            # was told so; seed 003: "An invocation whose event loop stalls past its
            # queue lease can still be redelivered while it is alive", and an attempt
            # "that follows another step_started with nothing recorded in between is a
            # redelivery".
            told = a.lease_lost_at()
            lapsed = told is not None and told <= b.started + 1e-6  # float rounding
            excused = lapsed or (o.tainted and _owner_lost(o, a, b.started))
            # Spec 9's counted residual risk (``residuals``): a body run before its start
            # committed, that start refused (a fence on an optimistic start), and another
            # delivery's run of the same attempt on the start that did commit (seed 350).
            excused = excused or (
                a.attempt == b.attempt
                and a.lease is not b.lease
                and logged_starts.get((step_id, a.attempt), 0) < ran_of.get((step_id, a.attempt), 0)
                and retries.get(op_id) != 0
            )
            if (a.ended is None or a.ended > b.started) and not excused:
                out.append(
                    Violation(
                        "overlap",
                        rid,
                        f"step {op_id} ({step_id}): attempt {b.attempt} started at "
                        f"{b.started:.3f} in {b.process} while attempt {a.attempt} "
                        f"(since {a.started:.3f} in {a.process}) still ran",
                    )
                )
            if retries.get(op_id) == 0 and not excused:
                out.append(
                    Violation(
                        "at_most_once",
                        rid,
                        f"step {op_id} (max_retries=0) started again at {b.started:.3f} in "
                        f"{b.process} (attempt {b.attempt}) under the live owner of its "
                        f"start at {a.started:.3f} in {a.process}",
                    )
                )
        for b in runs:
            if b.told_before_start and retries.get(op_id) != 0:
                out.append(
                    Violation(
                        "stale_body",
                        rid,
                        f"step {op_id} attempt {b.attempt} started at {b.started:.3f} in "
                        f"{b.process} by a {b.kind} delivery told at "
                        f"{b.lease_lost_at():.3f} that its lease lapsed",
                    )
                )
        for b in runs:
            cancelled_legit = (
                b.process in o.dead_processes or op_id in race_ids or o.cancelled_by_actor
            )
            if b.how == "cancelled" and not cancelled_legit:
                out.append(
                    Violation(
                        "cancelled_body",
                        rid,
                        f"step {op_id} attempt {b.attempt} cancelled at {b.ended} "
                        f"in {b.process}, which did not die",
                    )
                )
    starts = collections.Counter(
        e.correlation_id for e in o.log if isinstance(e.event, events.StepStarted)
    )
    ids = _op_ids(o.log)
    for e in o.log:
        err = getattr(e.event, "error", None)
        if e.type != "step_failed" or err is None or err.type != "StepAttemptsExhausted":
            continue
        runs = by_step.get(e.correlation_id or "", [])
        t = _vt(e)
        allowed = retries.get(ids.get(e.correlation_id or "", ""))
        if allowed is not None and starts[e.correlation_id] < allowed + 1:
            # Whatever faults did: only the attempts the log records are spent (seed 003
            # "next attempt would exceed maxRetries + 1"); an attempt lost is a real one.
            out.append(
                Violation(
                    "exhausted_early",
                    rid,
                    f"step {ids[e.correlation_id or '']} (max_retries={allowed}) failed as "
                    f"exhausted at slot {e.slot} after {starts[e.correlation_id]} start(s)",
                )
            )
        if o.owner_died:
            continue  # an owner died: exhausting the start it never ran is the rule
        if not runs:
            out.append(
                Violation(
                    "exhausted_unrun",
                    rid,
                    f"step {e.correlation_id} failed as exhausted at slot {e.slot} "
                    "but its body never ran",
                )
            )
        elif not o.tainted:
            # A stale owner's body may still run when its successor fails the step (a
            # max_retries=0 start is failed at once, whatever ran it: ``InlineSteps.rerun``).
            for b in runs:
                if b.started <= t and (b.ended is None or b.ended > t):
                    out.append(
                        Violation(
                            "exhausted_unrun",
                            rid,
                            f"step {b.op_id} failed as exhausted at {t:.3f} (slot {e.slot}) "
                            f"while attempt {b.attempt} still ran in {b.process}",
                        )
                    )
    return out


def _step_retries(o: RunOutcome) -> dict[str, int]:
    """Op id -> the step's ``max_retries`` (its ``r``), for every step of the program."""
    retries: dict[str, int] = {}
    for op in o.program.ops:
        for c in (
            [op]
            if op["k"] == "step"
            else op.get("ops", []) or ([op["step"]] if op["k"] == "race" else [])
        ):
            retries[c["id"]] = c["r"]
    return retries


def _unstarted(o: RunOutcome) -> tuple[int, list[Violation]]:
    """Body runs beyond the log's starts of their (step, attempt): how many (steps that
    allow retries: the residual risk), and a violation for each ``max_retries=0`` one."""
    started: dict[tuple[str, int], int] = {}
    for e in o.log:
        if isinstance(e.event, events.StepStarted) and e.correlation_id:
            key = (e.correlation_id, e.event.attempt)
            started[key] = started.get(key, 0) + 1
    ran: dict[tuple[str, int], list[BodyRun]] = {}
    for b in o.bodies:
        ran.setdefault((b.step_id, b.attempt), []).append(b)
    retries = _step_retries(o)
    count = 0
    out: list[Violation] = []
    for key, runs in ran.items():
        extra = len(runs) - started.get(key, 0)
        if extra <= 0:
            continue
        op_id = runs[0].op_id
        if retries.get(op_id) == 0:
            out.append(
                Violation(
                    "unstarted_body",
                    o.run_id,
                    f"step {op_id} (max_retries=0) attempt {key[1]} ran {len(runs)} time(s) "
                    f"with {started.get(key, 0)} start(s) in the log",
                )
            )
        else:
            count += extra
    return count, out


def residuals(o: RunOutcome) -> dict[str, int]:
    """The residual risks one spec 9 run met (counted and reported, never failed)."""
    count, _ = _unstarted(o)
    return {"body_before_refused_start": count} if count else {}
