"""Run-ahead on spec 9 runs (issue 15 item 1; seed 003 "Run-ahead", "Run-ahead and turbo
edge cases"; ``treadle.orchestrator.runahead``).

Each test runs on both real Worlds (local, and Postgres + NATS) through
``faults.FaultyWorld``, which counts the World calls and injects what a test arms.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from treadle import Workflows
from treadle.orchestrator import runahead
from treadle.world import events

from .conftest import MakeApp
from .faults import FaultyWorld

STEPS = 6


def _shape(log: list[events.LoggedEvent]) -> list[tuple[Any, ...]]:
    """The log without its run's ids and times: what run-ahead must leave unchanged."""
    return [
        (
            e.slot,
            e.event.type,
            getattr(e.event, "step_name", None),
            getattr(e.event, "attempt", None),
            getattr(e.event, "result", None),
        )
        for e in log
    ]


def _pipeline(app: Workflows, ran: Counter[str]) -> Any:
    @app.step
    async def add(x: int, n: int) -> int:
        ran[f"add{n}"] += 1
        return x + n

    @app.workflow
    async def pipeline(x: int) -> int:
        for n in range(STEPS):
            x = await add(x, n)
        return x

    return pipeline


def _writes(world: FaultyWorld) -> int:
    return sum(1 for kind, kw in world.events.calls if kw.get("in_band"))


async def test_a_clean_run_ahead_leaves_the_log_as_without_it_in_fewer_writes(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """The same sequential pipeline with run-ahead off and at depth 10: the same log
    (slots, types, steps, attempts, results), and a step's outcome and the next start
    in one write, so fewer in-band writes."""
    shapes = []
    writes = []
    for depth in (0, 10):
        ran: Counter[str] = Counter()
        app = make_app(world=faulty, WORKFLOW_RUN_AHEAD_DEPTH=depth)
        before = _writes(faulty)
        run = await app.start(_pipeline(app, ran), 0)
        assert await run.result(timeout=30) == sum(range(STEPS))
        writes.append(_writes(faulty) - before)
        shapes.append(_shape(await run.events()))
        assert ran == Counter({f"add{n}": 1 for n in range(STEPS)}), "each body ran once"
        await app.close(grace_seconds=2)
    print("WRITES", writes)
    assert shapes[0] == shapes[1]
    assert writes[1] < writes[0], writes
    assert writes[1] <= STEPS + 3, writes  # run_started, one per step, the last outcome, the end
