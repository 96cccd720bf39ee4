"""``Run.result`` waits on the World's live feed: no poll while the feed works, and a
logged fallback to polling when it fails (``treadle.resultwait``). Both Worlds."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
import pytest

from treadle import resultwait
from treadle.world import contract, events, records

from .conftest import WORLD_CASES, MakeApp, OpenWorld

pytestmark = pytest.mark.parametrize("open_world", WORLD_CASES, indirect=True)

NEVER = 3600.0  # a poll interval no test outlives: an answer must come from the feed
WAIT = 30.0  # below resultwait.FEED_CHECK_SECONDS: the safety read never answers in time


class Observed:
    """A real World whose ``runs.get`` calls are announced (the wait's reads)."""

    def __init__(self, world: contract.World) -> None:
        self.world = world
        self.events = world.events
        self.reads = 0
        self.read = asyncio.Event()
        self.runs = self

    async def get(self, run_id: str) -> records.RunRecord:
        run = await self.world.runs.get(run_id)
        self.reads += 1
        self.read.set()
        return run


async def _run(world: contract.World) -> str:
    run = await world.runs.create(workflow_name="wf", input=None, deployment_id="d", spec_version=9)
    return run.run_id


async def test_a_workflows_result_arrives_with_the_poll_disabled(make_app: MakeApp) -> None:
    """A real workflow on the World under test: its result arrives through the feed."""
    app = make_app(TREADLE_RESULT_POLL_SECONDS=NEVER)
    gate, started = asyncio.Event(), asyncio.Event()

    @app.step
    async def held(n: int) -> int:
        started.set()
        await gate.wait()
        return n + 1

    @app.workflow
    async def flow(n: int) -> int:
        return await held(n) * 2

    run = await app.start(flow, 20)
    await asyncio.wait_for(started.wait(), WAIT)
    waiting = asyncio.ensure_future(run.result())
    gate.set()
    assert await asyncio.wait_for(waiting, WAIT) == 42


async def test_the_wait_subscribes_after_its_read_and_hears_the_end(
    open_world: OpenWorld,
) -> None:
    """The run ends after the wait's first read: the feed, not a poll, reports it, and
    the wait reads the run only once more."""
    world = await open_world()
    try:
        run_id = await _run(world)
        observed = Observed(world)
        wait = resultwait.RunEnd(observed, run_id, NEVER)  # type: ignore[arg-type]
        waiting = asyncio.ensure_future(wait.wait(None))
        await asyncio.wait_for(observed.read.wait(), WAIT)
        await world.events.create(run_id, events.RunCancelled(reason="done"), in_band=False)
        ended = await asyncio.wait_for(waiting, WAIT)
        assert ended.status == "cancelled"
        assert observed.reads == 2 and wait.feed_failure is None
    finally:
        await world.close()


async def test_an_end_before_the_subscription_is_not_missed(open_world: OpenWorld) -> None:
    """The run ends between the wait's read and its subscription (which starts after the
    slot the read saw): the feed still delivers the end."""
    world = await open_world()
    try:
        run_id = await _run(world)

        class EndsAfterRead(Observed):
            async def get(self, run_id: str) -> records.RunRecord:
                run = await super().get(run_id)
                if self.reads == 1:
                    cancel = events.RunCancelled(reason="between")
                    await self.world.events.create(run_id, cancel, in_band=False)
                return run

        observed = EndsAfterRead(world)
        wait = resultwait.RunEnd(observed, run_id, NEVER)  # type: ignore[arg-type]
        ended = await asyncio.wait_for(wait.wait(None), WAIT)
        assert ended.status == "cancelled" and wait.feed_failure is None
    finally:
        await world.close()


async def test_a_timeout_still_raises_timeout_error(open_world: OpenWorld) -> None:
    world = await open_world()
    try:
        run_id = await _run(world)
        with pytest.raises(TimeoutError, match="still pending"):
            await resultwait.RunEnd(world, run_id, NEVER).wait(0.2)
    finally:
        await world.close()


async def test_a_lost_feed_is_logged_and_the_wait_polls(
    open_world: OpenWorld, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """Postgres: the LISTEN connection is killed under the wait; it logs why and polls."""
    if "postgres" not in request.node.callspec.params["open_world"]:
        pytest.skip("the local World's feed is in process: it has no connection to lose")
    world: Any = await open_world()
    try:
        run_id = await _run(world)
        observed = Observed(world)
        wait = resultwait.RunEnd(observed, run_id, 0.05)  # type: ignore[arg-type]
        caplog.set_level(logging.WARNING, logger="treadle.client.result")
        waiting = asyncio.ensure_future(wait.wait(None))
        await asyncio.wait_for(observed.read.wait(), WAIT)
        await world.storage.feed.listening()
        admin = await asyncpg.connect(request.getfixturevalue("pg_dsn"))
        try:
            await admin.fetchval("SELECT pg_terminate_backend($1)", world.storage.feed.listener_pid)
        finally:
            await admin.close()
        for _ in range(400):
            if wait.feed_failure is not None:
                break
            await asyncio.sleep(0.025)
        assert wait.feed_failure is not None and "LISTEN connection" in wait.feed_failure
        assert any("polling every 0.05 s" in r.getMessage() for r in caplog.records)
        reads = observed.reads
        await world.events.create(run_id, events.RunCancelled(reason="polled"), in_band=False)
        ended = await asyncio.wait_for(waiting, WAIT)
        assert ended.status == "cancelled" and observed.reads > reads
    finally:
        await world.close()
