"""Regression tests of engine bugs the simulation's soak of seeds 1000-2999 found.

Seed 1309 (pinned in tests/testing/test_simulation.py): a delivery lingering on an open
background step took the step's ``step_completed`` from its live feed, and the feed
dropped in the same instant. The linger ended as "nothing new" (it checked the feed
before the news), the delivery acked with that event absorbed but never decided on,
and recorded the run as consumed through it; the wake the step sent then found
"nothing new since this process consumed the run" and acked too. The run never ended.
The test recreates it on both Worlds: the feed drops right after pushing the outcome.
With the fix reverted it fails on Postgres + NATS (the run hangs); on the local World
the run still ends, by a path not traced (the local feed is polled, so its push and the
step's wake interleave differently): the simulation's pinned seed 1309 guards it too.
"""

from __future__ import annotations

from treadle.world import events

from .conftest import MakeApp
from .faults import FaultyWorld


async def test_a_feed_that_drops_right_after_pushing_an_outcome_does_not_lose_it(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    app = make_app(
        world=faulty, WORKFLOW_MAX_INLINE_STEPS=0, WORKFLOW_ORCHESTRATOR_LINGER_MS=20_000
    )

    @app.step
    async def fetch() -> str:
        return "fetched"

    @app.workflow
    async def flow() -> str:
        return (await fetch()) + " and done"

    faulty.events.drop_feed_after(1, when=lambda e: isinstance(e, events.StepCompleted))
    run = await app.start(flow)
    # The linger (20 s) outlasts the timeout: only a delivery that decides on the pushed
    # outcome, or a wake that is not taken for "nothing new", ends the run in time.
    assert await run.result(timeout=15) == "fetched and done"
    assert faulty.events.feed_drops[0].times == 0, "the feed dropped after the outcome"
