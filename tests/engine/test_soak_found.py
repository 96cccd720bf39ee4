"""Regression tests of engine bugs the simulation's soak of seeds 1000-2999 found.

Seed 1309 (pinned in tests/testing/test_simulation.py): a delivery lingering on an open
background step took the step's ``step_completed`` from its live feed, and the feed
dropped in the same instant. The linger ended as "nothing new" (it checked the feed
before the news), the delivery acked with that event absorbed but never decided on,
and recorded the run as consumed through it; the wake the step sent then found
"nothing new since this process consumed the run" and acked too. The run never ended.

The test recreates it on both Worlds. The lingering delivery must be one of a plain
wake (a local World re-runs a coalesced delivery with its holder's message, and a
start message is never "nothing new"): ``first`` outlasts the start delivery's linger,
so its wake is a delivery of its own, which creates ``second`` and lingers; the feed
drops right after pushing ``second``'s outcome. With the fix reverted the run hangs on
both Worlds.
"""

from __future__ import annotations

import asyncio

from treadle.world import events

from .conftest import MakeApp
from .faults import FaultyWorld


async def test_a_feed_that_drops_right_after_pushing_an_outcome_does_not_lose_it(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=0, WORKFLOW_ORCHESTRATOR_LINGER_MS=1500)

    # The bodies' own durations place the outcomes: first's after the start delivery's
    # linger ended, second's while its creator (first's wake) still lingers.
    @app.step
    async def first() -> str:
        await asyncio.sleep(2.5)
        return "one"

    @app.step
    async def second() -> str:
        await asyncio.sleep(0.3)
        return "two"

    @app.workflow
    async def flow() -> str:
        return f"{await first()} {await second()}"

    faulty.events.drop_feed_after(
        1, when=lambda e: isinstance(e, events.StepCompleted) and e.step_name == "second"
    )
    run = await app.start(flow)
    assert await run.result(timeout=20) == "one two"
    assert faulty.events.feed_drops[0].times == 0, "the feed dropped after second's outcome"
