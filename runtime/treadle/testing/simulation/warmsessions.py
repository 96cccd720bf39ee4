"""Warm replay sessions under simulation (``treadle.orchestrator.warm``, issue 15 item 5).

Every simulated worker process has its own ``Runtime`` and so its own cache of warm
sessions; a process that dies takes its cache with it, and its replacement (a restart
in place too) starts with none. Hook resumes, cancels, wake-ups and background steps
write out of band between two deliveries, and two processes deliver one run's messages
in turn, so a kept session often meets a log another process advanced: it must go cold.

Per seed, from a stream of its own (the other draws stay as the pinned seeds found
them): ``TREADLE_WARM_RUNS`` off for a quarter of the seeds, 1 (every other run's
session evicts the last) for a quarter, else the default; and for a fifth of the seeds
with it on, ``TREADLE_WARM_EVENTS`` small enough that long runs are evicted or never kept.

``verify``, installed as ``warm.VERIFY`` for the simulation, is a differential check:
each time a delivery continues a warm session, a cold replay of the same log (what the
delivery would have done without it) is advanced beside it and both must reach the same
outcome (the same new operations at the same positions, the same disposals, the same
result or failure). A difference is a ``warm_mismatch`` violation of the seed. At the
end of a seed, ``check_kept`` compares every session a live process still keeps with
the log: the events it holds and the ones its replay was fed must be the log's own, slot
by slot (a speculative event kept in place of what committed would be a mismatch).
"""

from __future__ import annotations

import collections
import random
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from treadle import settings
from treadle.orchestrator import warm
from treadle.replay import engine, operations

if TYPE_CHECKING:
    from treadle.orchestrator.session import RunSession

OFF_SHARE = 0.25
ONE_SHARE = 0.25
SMALL_EVENTS_SHARE = 0.2
SMALL_EVENTS = 40

# Differences found by ``verify`` since the last ``take_mismatches`` (run id, what).
_MISMATCHES: list[tuple[str, str]] = []


def draw(seed: int, fixed: int | None) -> dict[str, int]:
    """The seed's warm-session settings (``fixed``: TREADLE_WARM_RUNS for every seed)."""
    rng = random.Random(f"{seed}/warm")
    default_runs = int(settings.Settings.model_fields["TREADLE_WARM_RUNS"].default)
    default_events = int(settings.Settings.model_fields["TREADLE_WARM_EVENTS"].default)
    pick = rng.random()
    small = rng.random() < SMALL_EVENTS_SHARE
    if fixed is not None:
        runs = fixed
    elif pick < OFF_SHARE:
        runs = 0
    elif pick < OFF_SHARE + ONE_SHARE:
        runs = 1
    else:
        runs = default_runs
    events = SMALL_EVENTS if small and fixed is None else default_events
    return {"TREADLE_WARM_RUNS": runs, "TREADLE_WARM_EVENTS": events}


def stats() -> dict[str, int]:
    """``warm.STATS`` flattened (cold reasons as ``cold:<reason>``), for deltas."""
    s = warm.STATS
    out = {"kept": s.kept, "resumed": s.resumed, "evicted": s.evicted}
    out.update({f"cold:{k}": v for k, v in s.cold.items()})
    return out


def delta(before: dict[str, int]) -> collections.Counter[str]:
    after = stats()
    return collections.Counter(
        {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    )


def take_mismatches() -> list[tuple[str, str]]:
    out = list(_MISMATCHES)
    _MISMATCHES.clear()
    return out


def _describe(outcome: engine.Outcome) -> Any:
    match outcome:
        case engine.Suspended(new=new, dispose=dispose):
            return (
                "suspended",
                [_op(op) for op in new],
                sorted(op.correlation_id for op in dispose),
            )
        case engine.Completed(value=value):
            return ("completed", repr(value))
        case engine.Failed(error=error):
            return ("failed", type(error).__name__, str(error))
        case engine.Diverged() | engine.Ended():
            return outcome
    return repr(outcome)


def _op(op: operations.Operation) -> tuple[Any, ...]:
    if isinstance(op, operations.StepCall):
        return ("step", op.position, op.correlation_id, op.step_name, repr(op.input))
    if isinstance(op, operations.Sleep):
        return ("wait", op.position, op.correlation_id, op.resume_at.isoformat())
    if isinstance(op, operations.HookWait):
        return ("hook", op.position, op.correlation_id, op.token)
    return (op.kind, op.position, op.correlation_id)


def verify(session: RunSession) -> None:
    """Advance the adopted warm replay and a cold replay of the same log; compare."""
    replay, workflow = session.replay, session.warm_workflow
    assert replay is not None
    assert workflow is not None
    cold = session.new_replay(workflow)  # started as the session starts its own
    try:
        for event in session.loaded:
            cold.feed(event)
        want = _describe(cold.advance())
    finally:
        cold.close()
    got = _describe(replay.advance())
    if got != want:
        _MISMATCHES.append((session.run_id, f"warm {got!r}, cold {want!r}"))


def check_kept(processes: Iterable[Any], backend: Any) -> None:
    """Every live process's kept sessions hold the log's own events (the docstring)."""
    for proc in processes:
        worker = getattr(proc, "worker", None)
        if proc.dead or worker is None:
            continue
        for kept in worker.rt.warm.sessions():
            log = list(backend.events_of(kept.run_id))
            fed = kept.replay._fed
            if len(log) < kept.tail or len(fed) != kept.tail:
                _MISMATCHES.append(
                    (kept.run_id, f"{proc.name} keeps {kept.tail} events, the log has {len(log)}")
                )
                continue
            for held, ate, logged in zip(kept.loaded, fed, log, strict=False):
                if held != logged or (ate.slot, ate.created_at, ate.event) != (
                    logged.slot,
                    logged.created_at,
                    logged.event,
                ):
                    _MISMATCHES.append(
                        (kept.run_id, f"{proc.name} keeps slot {logged.slot} unlike the log")
                    )
                    break
