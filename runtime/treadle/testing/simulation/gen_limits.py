"""The simulation's concurrency and rate limit workload (issue 17 item 4).

On a seed whose own stream (``<seed>/limits``) draws it (about two in five), the
simulation also registers ``sim_limited``: a workflow limited to ``max`` runs per key
(and, on some seeds, to a start rate), each running ``steps`` calls of
``sim_limited_body``, a step limited to ``step_max`` attempts per key, and starts a
handful of its runs with drawn keys and priorities, some cancelled while they wait or
run. A seed that draws no limits registers nothing and runs exactly as before.

The invariants (``invariants_limits.check``): per key, never more than ``max`` runs
between their ``run_started`` and their end, never more than ``step_max`` step attempts
between a ``step_started`` and that attempt's end, a rate's starts never ahead of its
bucket, and every limited run ends: completed with its expected output, or cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field
from typing import Any

from treadle import Limit, Rate, Run, Workflows, errors

WORKFLOW = "sim_limited"
STEP = "sim_limited_body"


@dataclass(frozen=True)
class LimitedRun:
    key: str
    n: int
    steps: int
    priority: int
    start_at: float  # virtual seconds after the programs started
    cancel_at: float | None = None


@dataclass(frozen=True)
class LimitPlan:
    max: int
    step_max: int
    rate_ms: int | None
    runs: tuple[LimitedRun, ...]
    hold: float

    def expected(self, run: LimitedRun) -> int:
        return sum(run.n * 10 + i for i in range(run.steps))


@dataclass
class LimitRuns:
    plan: LimitPlan
    started: list[tuple[LimitedRun, Run]] = field(default_factory=list)
    first_start: float | None = None


def draw(seed: int) -> LimitPlan | None:
    rng = random.Random(f"{seed}/limits")
    if rng.random() >= 0.4:
        return None
    keys = ["a", "b", "c"][: rng.choice([1, 2, 3])]
    runs = tuple(
        LimitedRun(
            key=rng.choice(keys),
            n=n,
            steps=rng.choice([0, 1, 2]),
            priority=rng.choice([0, 0, 1, 5]),
            start_at=rng.choice([0.0, 0.0, 0.5, 3.0, 20.0]),
            cancel_at=rng.choice([None] * 6 + [0.2, 2.0, 15.0]),
        )
        for n in range(rng.randint(3, 7))
    )
    return LimitPlan(
        max=rng.choice([1, 1, 2]),
        step_max=rng.choice([1, 2]),
        rate_ms=rng.choice([None, None, 500, 2000]),
        runs=runs,
        hold=rng.choice([0.0, 0.3, 2.0]),
    )


def build(app: Workflows, plan: LimitPlan) -> None:
    """Register the limited workflow and step on ``app`` (every simulated process's)."""
    rate = (
        Rate(key=lambda key, n, steps: key, per_second=1000 / plan.rate_ms)
        if plan.rate_ms
        else None
    )

    @app.step(name=STEP, concurrency=Limit(key=lambda key, value: key, max=plan.step_max))
    async def body(key: str, value: int) -> int:
        if plan.hold:
            await asyncio.sleep(plan.hold)
        return value

    @app.workflow(
        name=WORKFLOW,
        concurrency=Limit(key=lambda key, n, steps: key, max=plan.max),
        rate=rate,
    )
    async def limited(key: str, n: int, steps: int) -> int:
        total = 0
        for i in range(steps):
            total += await body(key, n * 10 + i)
        return total


async def start(app: Workflows, plan: LimitPlan, now: Any, keep: Any, watch: Any) -> LimitRuns:
    """Start the plan's runs due at 0 s now, and the later ones (and the cancels) from
    tasks ``keep`` runs; ``watch(run_id)`` follows each run to its end."""
    out = LimitRuns(plan, first_start=now())

    async def begin(run: LimitedRun) -> None:
        handle = await app.start(WORKFLOW, run.key, run.n, run.steps, priority=run.priority)
        out.started.append((run, handle))
        watch(handle.run_id)
        if run.cancel_at is not None:
            keep(cancel(handle, run.cancel_at))

    async def later(run: LimitedRun) -> None:
        await asyncio.sleep(run.start_at)
        await begin(run)

    for run in plan.runs:
        if run.start_at:
            keep(later(run))
        else:
            await begin(run)
    return out


async def cancel(handle: Run, after: float) -> None:
    await asyncio.sleep(after)
    with contextlib.suppress(errors.RunExpired):
        await handle.cancel("simulated cancel of a limited run")
