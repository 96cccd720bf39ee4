"""Shrinking a failing seed to a small program and few faults.

``shrink(report)`` keeps the seed and greedily tries smaller configurations:
fewer runs, fewer fault kinds and a smaller fault budget, fewer and smaller
operations, no fan-outs, hooks, outside actors or long sleeps. A candidate is
kept when it still shows a violation of the same kind. Every candidate is a
full deterministic simulation, so the result replays with the command its
report prints. Used by ``__main__ --shrink`` and by tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from treadle.testing.simulation.faults import FaultPlan
from treadle.testing.simulation.runner import Config, Report, simulate


def _candidates(c: Config, plan: FaultPlan) -> Iterator[Config]:
    for runs in range(1, c.runs):
        yield dataclasses.replace(c, runs=runs, plan=plan)
    for kind in sorted(plan.rates):
        yield dataclasses.replace(c, plan=plan.without(kind))
    if plan.budget > 1:
        yield dataclasses.replace(
            c, plan=FaultPlan(dict(plan.rates), plan.budget // 2, plan.quiet_after)
        )
    s = c.shape
    for ops in range(1, s.max_ops):
        yield dataclasses.replace(c, plan=plan, shape=dataclasses.replace(s, max_ops=ops))
    if s.max_gather > 2:
        yield dataclasses.replace(
            c, plan=plan, shape=dataclasses.replace(s, max_gather=max(2, s.max_gather // 2))
        )
    for flag in ("fanout", "hooks", "actors", "long_sleeps"):
        if getattr(s, flag):
            yield dataclasses.replace(c, plan=plan, shape=dataclasses.replace(s, **{flag: False}))
    if c.processes > 1:
        yield dataclasses.replace(c, plan=plan, processes=c.processes - 1)


def shrink(
    report: Report,
    *,
    max_attempts: int = 60,
    kinds: set[str] | None = None,
    on_step: Callable[[Report], None] | None = None,
) -> Report:
    """The smallest failing report found from ``report`` (itself when nothing smaller fails).

    A candidate counts when it shows a violation of one of ``kinds`` (default: the
    kinds ``report`` shows).
    """
    if report.ok:
        return report
    kinds = kinds or {v.kind for v in report.violations}
    best = report
    attempts = 0
    improved = True
    while improved and attempts < max_attempts:
        improved = False
        for cand in _candidates(best.config, best.plan):
            attempts += 1
            if attempts > max_attempts:
                break
            got = simulate(best.seed, cand)
            if any(v.kind in kinds for v in got.violations):
                best = got
                improved = True
                if on_step is not None:
                    on_step(got)
                break
    return best
