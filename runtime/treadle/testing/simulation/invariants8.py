"""The invariants of spec 8 runs (seed 000; issue 12 item 5), and the residual risks counted.

Spec 8 promises less than spec 9: several deliveries of a run write at once,
out-of-band and unfenced, so the single-writer checks of ``invariants`` (a
delivery told its lease lapsed writes nothing and starts no body, handoff
budgets, a body never outlives its owner's lease) do not apply. What spec 8
does promise, and ``judge(outcome)`` checks:

- ``log``: ``treadle.world.logcheck`` (dense slots, one terminal event, at most
  one outcome per step, one completion per wait), plus duplicate creations
  refused: no second ``step_created`` (or one after the inline ``step_started``
  that created the step), no second lazy inline start, no second
  ``wait_created`` or ``hook_created`` for one correlation id;
- ``wedge``: the run is not terminal at the bound and no message is left that
  could drive it (seed 000: "never wedges"); ``never_ended``: not terminal, with
  messages left;
- ``duplicate_inline``: an inline step's body started again, overlapping the
  first, inside the first's ownership lease, while its owner lived, other than
  by the owner's own message redelivered (issue #2780);
- ``single_flight``: a body of a step overlapped an inline body of it in the same
  process (``Runtime.single_flight`` absorbs a second inline claimant, and a step
  message finding the body running here waits for it);
- ``overlap``: a body run from a step message overlapped a later one while its
  delivery still held its lease and its process lived;
- ``at_most_once``: a ``max_retries=0`` step's body ran twice (owned recovery of
  such a step fails it as exhausted; it never runs the body again);
- ``exhausted_live``: a step failed as exhausted while its owner ran its body inside
  the lease (past the lease, or by the owner's message redelivered, it is one of the
  residual risks below: a ``max_retries=0`` step is failed, never run twice);
- ``output`` (the program's fault-free result, as for spec 9: both formats give
  the same results), ``cancelled_body``, ``exhausted_unrun`` (only on a run no
  fault touched) and ``deliveries`` (twice spec 9's bound: nothing coalesces).

The only exceptions tolerated are seed 000's "Accepted residual risks", each
counted in ``Judgement.residuals`` and reported, never failed:

- ``redelivery_while_alive``: the queue delivered the owner's message again
  (its lease lapsed, or its process stalled past it) while an earlier delivery of it
  still lived; either may then recover the step (inline, or through the step's
  message when it has no free inline slot) while the other runs the body (a step
  message redelivered the same way counts here too);
- ``longer_than_lease``: the body outlived the ownership lease and the step ran
  again, or (``max_retries=0``) was failed as exhausted, while it still ran (the
  backstop or a wake found the lease expired).

A body the simulation's end cut off (every process is killed then) is no
``cancelled_body``: a spec 8 run may end while a body it no longer waits for runs.

``classify`` is the pure rule for one pair of bodies, unit-tested on synthetic
records. Used by the runner for every run whose record says spec 8.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from treadle.testing.simulation import invariants
from treadle.testing.simulation.invariants import RunOutcome, Violation
from treadle.testing.simulation.loop import EPOCH
from treadle.testing.simulation.workload import BodyRun, DeliveryRun, outcomes_expected
from treadle.world import events, logcheck

Verdict = Literal[
    "sequential",
    "owner_dead",
    "queue_redelivery",
    "redelivery_while_alive",
    "longer_than_lease",
    "single_flight",
    "duplicate_inline",
    "overlap",
]
RESIDUALS = ("redelivery_while_alive", "longer_than_lease")
# Verdicts that are no failure (the residual risks are counted besides).
TOLERATED = frozenset({"sequential", "owner_dead", "queue_redelivery", *RESIDUALS})

_EPS = 1e-6  # float rounding of virtual times


@dataclass
class Judgement:
    violations: list[Violation] = field(default_factory=list)
    residuals: collections.Counter[str] = field(default_factory=collections.Counter)
    # What happened that is no failure: owned recoveries, bodies, tolerated pairs.
    notes: collections.Counter[str] = field(default_factory=collections.Counter)


def _stalled(stalls: Sequence[tuple[float, float]], since: float, until: float) -> bool:
    return any(s <= until + _EPS and e >= since for s, e in stalls)


def _lapsed(a: BodyRun, until: float) -> bool:
    told = a.lease_lost_at()
    return told is not None and told <= until + _EPS


def classify(
    a: BodyRun,
    b: BodyRun,
    *,
    epoch: float,
    lease: float,
    killed_at: float | None = None,
    stalls: Sequence[tuple[float, float]] = (),
    redelivered_at: float | None = None,
) -> Verdict:
    """How body ``b`` of a step (started later) stands to body ``a`` of the same step.

    ``epoch`` is the virtual time of the ``step_started`` that ``a`` ran under (its
    ownership epoch), ``lease`` the ownership lease, ``killed_at`` and ``stalls`` those
    of ``a``'s process, ``redelivered_at`` the first time ``a``'s message was delivered
    again while an earlier delivery of it still lived (``redelivered_while_alive``).
    Either live delivery may recover the step, inline or through the step's message
    (no free inline slot), so from then on a second body is the first residual risk.
    """
    if a.ended is not None and a.ended <= b.started + _EPS:
        return "sequential"
    if killed_at is not None and killed_at <= b.started + _EPS:
        return "owner_dead"
    if a.kind != "orchestrator":
        # ``a`` ran from its own step message: the queue's at-least-once envelope.
        if _lapsed(a, b.started) or _stalled(stalls, a.started, b.started):
            return "queue_redelivery"
        return "overlap"
    if b.process == a.process:
        # One process runs one body of a step at a time: an inline claimant waits on the
        # single-flight, and so does a step message finding an inline body running here.
        return "single_flight"
    if b.started + _EPS >= epoch + lease:
        return "longer_than_lease"
    if redelivered_at is not None and redelivered_at <= b.started + _EPS:
        return "redelivery_while_alive"
    same = b.kind == "orchestrator" and b.message_id is not None and b.message_id == a.message_id
    if same and (_lapsed(a, b.started) or _stalled(stalls, a.started, b.started)):
        return "redelivery_while_alive"
    return "duplicate_inline"


def redelivered_while_alive(
    deliveries: Sequence[DeliveryRun], killed_at: Mapping[str, float | None]
) -> dict[str, float]:
    """Message id -> the first time it was delivered again while an earlier delivery of
    it had neither settled nor lost its process (seed 000: a visibility lapse or a
    heartbeat partition inside the queue)."""
    by_message: dict[str, list[DeliveryRun]] = {}
    for d in deliveries:
        by_message.setdefault(d.message_id, []).append(d)
    found: dict[str, float] = {}
    for message_id, runs in by_message.items():
        runs.sort(key=lambda d: d.started)
        for first, later in itertools.combinations(runs, 2):
            died = killed_at.get(first.process)
            settled = first.settled if first.settled is not None else float("inf")
            if settled > later.started and (died is None or died > later.started):
                found[message_id] = min(found.get(message_id, later.started), later.started)
    return found


def _vt(e: events.LoggedEvent) -> float:
    return e.created_at.timestamp() - EPOCH


def epochs(log: Sequence[events.LoggedEvent]) -> dict[tuple[str, int], float]:
    """(step id, attempt) -> virtual time of that attempt's first ``step_started``."""
    found: dict[tuple[str, int], float] = {}
    for e in log:
        if isinstance(e.event, events.StepStarted) and e.correlation_id:
            found.setdefault((e.correlation_id, e.event.attempt), _vt(e))
    return found


def duplicate_creations(log: Sequence[events.LoggedEvent]) -> list[str]:
    """Creations the World must have refused (spec 8: the loser's duplicate, no hole)."""
    found: list[str] = []
    created: dict[str, int] = {}
    waits: dict[str, int] = {}
    hooks: dict[str, int] = {}
    for e in log:
        cid = e.correlation_id
        if cid is None:
            continue
        lazy = isinstance(e.event, events.StepStarted) and e.event.inline and e.event.attempt == 1
        if e.type == "step_created" or lazy:
            if cid in created:
                what = "step_created" if e.type == "step_created" else "a lazy inline start"
                found.append(
                    f"step {cid}: {what} at slot {e.slot} after its creation at slot {created[cid]}"
                )
            else:
                created[cid] = e.slot
        elif e.type in ("wait_created", "hook_created"):
            seen = waits if e.type == "wait_created" else hooks
            if cid in seen:
                found.append(f"{e.type} {cid} at slot {e.slot}, again (first at slot {seen[cid]})")
            else:
                seen[cid] = e.slot
    return found


def _retries(o: RunOutcome) -> dict[str, int]:
    found: dict[str, int] = {}
    for op in o.program.ops:
        kids = [op] if op["k"] == "step" else op.get("ops", [])
        if op["k"] == "race":
            kids = [op["step"]]
        for c in kids:
            found[c["id"]] = c["r"]
    return found


def _pair_text(op_id: str, step_id: str, a: BodyRun, b: BodyRun) -> str:
    return (
        f"step {op_id} ({step_id}): attempt {b.attempt} started at {b.started:.3f} in "
        f"{b.process} by {b.kind} message {b.message_id}, while attempt {a.attempt} (since "
        f"{a.started:.3f} in {a.process}, {a.kind} message {a.message_id}) still ran"
    )


_PAIR_KINDS = {"duplicate_inline", "single_flight", "overlap"}


def _rerun_excused(verdict: Verdict, a: BodyRun, b: BodyRun, o: RunOutcome) -> bool:
    """May a ``max_retries=0`` step whose first body is ``a`` run body ``b`` too?

    Only as a residual risk or the queue's envelope. A step first run inline never
    otherwise: its owned recovery fails it as exhausted (it cannot know whether the
    body ran). A step first run from its step message keeps spec 9's rule: a rerun
    after its delivery lost its lease or its process died or stalled.
    """
    if verdict in RESIDUALS or verdict == "queue_redelivery":
        return True
    if a.kind == "orchestrator" or verdict in _PAIR_KINDS:
        return False
    killed = o.killed_at.get(a.process)
    return (
        _lapsed(a, b.started)
        or (killed is not None and killed <= b.started + _EPS)
        or _stalled(o.stalls.get(a.process, []), a.started, b.started)
    )


def _judge_bodies(o: RunOutcome, j: Judgement) -> None:
    rid = o.run_id
    starts = epochs(o.log)
    again = redelivered_while_alive(o.delivery_runs, o.killed_at)
    retries = _retries(o)
    by_step: dict[str, list[BodyRun]] = {}
    for b in o.bodies:
        by_step.setdefault(b.step_id, []).append(b)
    race_ids = {op["step"]["id"] for op in o.program.ops if op["k"] == "race"}
    for step_id, runs in by_step.items():
        runs.sort(key=lambda b: b.started)
        op_id = runs[0].op_id
        j.notes["bodies"] += len(runs)
        j.notes["inline bodies"] += sum(b.kind == "orchestrator" for b in runs)
        for a, b in itertools.combinations(runs, 2):
            verdict = classify(
                a,
                b,
                epoch=starts.get((step_id, a.attempt), a.started),
                lease=o.ownership_lease,
                killed_at=o.killed_at.get(a.process),
                stalls=o.stalls.get(a.process, []),
                redelivered_at=again.get(a.message_id or ""),
            )
            if a.kind == "orchestrator" and b.message_id == a.message_id and b.kind == a.kind:
                j.notes["owned recoveries"] += 1
            if verdict in RESIDUALS:
                j.residuals[verdict] += 1
            elif verdict == "queue_redelivery":
                j.residuals["redelivery_while_alive"] += 1
                j.notes["redelivery_while_alive (step message)"] += 1
            elif verdict in _PAIR_KINDS:
                j.violations.append(Violation(verdict, rid, _pair_text(op_id, step_id, a, b)))
            if retries.get(op_id) == 0 and a is runs[0] and not _rerun_excused(verdict, a, b, o):
                j.violations.append(
                    Violation(
                        "at_most_once",
                        rid,
                        f"step {op_id} (max_retries=0) ran again at {b.started:.3f} in "
                        f"{b.process} (attempt {b.attempt}, {b.kind} message {b.message_id}) "
                        f"after its body started at {a.started:.3f} in {a.process} ({verdict})",
                    )
                )
        for b in runs:
            legit = b.process in o.dead_processes or op_id in race_ids or o.cancelled_by_actor
            legit = legit or (o.cut_at is not None and (b.ended or 0.0) + _EPS >= o.cut_at)
            if b.how == "cancelled" and not legit:
                j.violations.append(
                    Violation(
                        "cancelled_body",
                        rid,
                        f"step {op_id} attempt {b.attempt} cancelled at {b.ended} in "
                        f"{b.process}, which did not die",
                    )
                )
    _judge_exhausted_while_running(o, j, by_step, starts, again)
    if o.faults_on_run == 0 and not o.tainted:
        for e in o.log:
            err = getattr(e.event, "error", None)
            exhausted = err is not None and err.type == "StepAttemptsExhausted"
            if e.type == "step_failed" and exhausted and not by_step.get(e.correlation_id or ""):
                j.violations.append(
                    Violation(
                        "exhausted_unrun",
                        rid,
                        f"step {e.correlation_id} failed as exhausted at slot {e.slot} "
                        "but its body never ran (no fault touched the run)",
                    )
                )


def _judge_exhausted_while_running(
    o: RunOutcome,
    j: Judgement,
    by_step: dict[str, list[BodyRun]],
    starts: dict[tuple[str, int], float],
    again: dict[str, float],
) -> None:
    """A step failed as exhausted while an inline body of it still ran (a ``max_retries=0``
    step found running by a delivery that may not run it again): a residual risk past
    the lease or by the owner's message redelivered, a failure inside the lease while
    the owner lived (``exhausted_live``: the wake must have deferred to the owner)."""
    for e in o.log:
        err = getattr(e.event, "error", None)
        if e.type != "step_failed" or err is None or err.type != "StepAttemptsExhausted":
            continue
        t = _vt(e)
        for a in by_step.get(e.correlation_id or "", []):
            running = a.started <= t + _EPS and (a.ended is None or a.ended > t + _EPS)
            killed = o.killed_at.get(a.process)
            if not running or a.kind != "orchestrator" or (killed is not None and killed <= t):
                continue
            stalls = o.stalls.get(a.process, [])
            if t + _EPS >= starts.get((a.step_id, a.attempt), a.started) + o.ownership_lease:
                j.residuals["longer_than_lease"] += 1
                j.notes["longer_than_lease (failed as exhausted)"] += 1
            elif again.get(a.message_id or "", float("inf")) <= t + _EPS or (
                _lapsed(a, t) or _stalled(stalls, a.started, t)
            ):
                j.residuals["redelivery_while_alive"] += 1
                j.notes["redelivery_while_alive (failed as exhausted)"] += 1
            else:
                j.violations.append(
                    Violation(
                        "exhausted_live",
                        o.run_id,
                        f"step {a.op_id} ({a.step_id}) failed as exhausted at {t:.3f} (slot "
                        f"{e.slot}) while its owner ran attempt {a.attempt} in {a.process} "
                        f"since {a.started:.3f}, inside the lease",
                    )
                )


def judge(o: RunOutcome) -> Judgement:
    """Every spec 8 invariant on one run, and its residual risks counted."""
    j = Judgement()
    rid = o.run_id
    if o.record is None:
        j.violations.append(Violation("never_ended", rid, "the run was never recorded"))
        return j
    j.violations += [Violation("log", rid, p) for p in logcheck.problems(o.record, o.log)]
    j.violations += [Violation("log", rid, p) for p in duplicate_creations(o.log)]
    if not o.record.is_terminal:
        if o.messages_left == 0:
            j.violations.append(
                Violation(
                    "wedge",
                    rid,
                    f"still {o.record.status} at the bound with no message left to drive it",
                )
            )
        else:
            j.violations.append(
                Violation(
                    "never_ended",
                    rid,
                    f"still {o.record.status} at the bound ({o.messages_left} messages left)",
                )
            )
    _judge_bodies(o, j)
    race_ids = {op["step"]["id"] for op in o.program.ops if op["k"] == "race"}
    if not j.residuals:
        # A residual duplicate shifts what the body counted (its failures by runs).
        j.violations += invariants._check_output(o, race_ids)
    steps = len(outcomes_expected(o.program)) + len(race_ids)
    if o.deliveries > 2 * (80 + 6 * steps):
        j.violations.append(
            Violation("deliveries", rid, f"{o.deliveries} deliveries for {steps} steps")
        )
    return j
