"""Small workflows the serve tests run, and waiting on a run's log (never a fixed sleep)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from treadle import FatalError, Hook, RetryableError, Workflows, sleep
from treadle.world import contract, events


class Approval(Hook):
    approved: bool


@dataclass
class Flows:
    hi: Any
    fails: Any
    nap: Any
    approve: Any
    flaky: Any


def define(app: Workflows) -> Flows:
    """Register the test workflows on ``app`` (the fixture's worker serves them)."""
    tries: dict[str, int] = {}

    @app.step
    async def greet(name: str) -> str:
        return f"hi {name}"

    @app.step
    async def boom() -> None:
        raise FatalError("the oven is off")

    @app.step(max_retries=3)
    async def wobbly(key: str) -> str:
        tries[key] = tries.get(key, 0) + 1
        if tries[key] < 2:
            raise RetryableError("not yet", retry_after=0.01)
        return "steady"

    @app.workflow
    async def hi(name: str) -> str:
        return await greet(name)

    @app.workflow
    async def fails() -> None:
        await boom()

    @app.workflow
    async def nap() -> str:
        await sleep("1h")
        return "rested"

    @app.workflow
    async def approve(token: str) -> bool:
        got = await Approval.wait(token=token)
        return bool(got and got.approved)

    @app.workflow
    async def flaky(key: str) -> str:
        return await wobbly(key)

    return Flows(hi=hi, fails=fails, nap=nap, approve=approve, flaky=flaky)


async def wait_for_event(
    world: contract.World, run_id: str, event_type: str, timeout: float = 15.0
) -> events.LoggedEvent:
    """The first event of ``event_type`` in the run's log, waiting on the feed for it."""
    news = asyncio.Event()
    sub = world.events.subscribe(run_id, 0, lambda _e: news.set(), lambda _exc: news.set())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while True:
            news.clear()
            page = await world.events.list(run_id)
            for logged in page.events:
                if logged.type == event_type:
                    return logged
            left = deadline - loop.time()
            if left <= 0:
                seen = [e.type for e in page.events]
                raise AssertionError(f"run {run_id}: no {event_type} within {timeout} s: {seen}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(news.wait(), min(left, 0.5))
    finally:
        sub.close()
