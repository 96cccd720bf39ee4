"""``run.cancel()`` through the public API, on both run formats (issue 12 "Done when":
the engine suites on both formats; seed 003 "Writers outside the orchestrator"): the
cancel is an out-of-band ``run_cancelled``; nothing the run does afterwards lands in
its log, and nothing after it runs."""

from __future__ import annotations

import asyncio
import time

import pytest

from treadle import sleep
from treadle.errors import RunCancelledError

from .conftest import BOTH_FORMATS, MakeApp

# Spec 9 on both Worlds and spec 8 on the local one.
pytestmark = BOTH_FORMATS


async def _until_logged(run: object, type_: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while type_ not in [e.type for e in await run.events()]:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"never logged {type_}"
        await asyncio.sleep(0.02)  # polling the World's view of another task's progress


async def test_a_cancelled_sleeping_run_ends_cancelled_and_writes_nothing_more(
    make_app: MakeApp, spec_version: int
) -> None:
    app = make_app()

    @app.workflow
    async def napping() -> str:
        await sleep("1h")
        return "never"

    run = await app.start(napping)
    await _until_logged(run, "wait_created")
    await run.cancel(reason="no longer needed")
    with pytest.raises(RunCancelledError):
        await run.result(timeout=10)
    record = await run.get()
    assert (record.status, record.spec_version) == ("cancelled", spec_version)
    assert await run.wake_up() == 0  # an ended run: nothing recorded, nothing sent
    log = await run.events()
    assert log[-1].type == "run_cancelled" and not log[-1].in_band
    assert log[-1].event.reason == "no longer needed"  # type: ignore[union-attr]


async def test_a_cancel_while_an_inline_step_runs_stops_the_run_after_that_step(
    make_app: MakeApp,
) -> None:
    """The body in flight finishes (a cancel never cuts a side effect short); the run stays
    cancelled, and the step after it never runs."""
    app = make_app()
    entered = asyncio.Event()
    release = asyncio.Event()
    ran: list[str] = []

    @app.step
    async def slow() -> str:
        ran.append("slow")
        entered.set()
        await release.wait()
        return "slow done"

    @app.step
    async def after() -> str:
        ran.append("after")
        return "after done"

    @app.workflow
    async def flow() -> str:
        await slow()
        return await after()

    run = await app.start(flow)
    async with asyncio.timeout(10):
        await entered.wait()
    await run.cancel()
    release.set()
    with pytest.raises(RunCancelledError):
        await run.result(timeout=10)
    types = [e.type for e in await run.events()]
    assert "run_cancelled" in types and "run_completed" not in types
    assert (await run.get()).status == "cancelled"
    assert ran == ["slow"]
