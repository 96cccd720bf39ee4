"""Long sleeps in hops, cancel under a pending hop, the no-op wake, and unknown run formats."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from treadle import sleep
from treadle.errors import RunCancelledError
from treadle.world import messages
from treadle.worlds.local import LocalWorld

from .conftest import TUNING, MakeApp
from .faults import FaultyWorld


async def _faulty(tmp_path: Path) -> FaultyWorld:
    return FaultyWorld(await LocalWorld(tmp_path / "world", tuning=TUNING).open())


async def test_a_long_sleep_is_reached_in_hops_each_sent_once(
    tmp_path: Path, make_app: MakeApp
) -> None:
    """C7: with a 0.3 s hop, a 1 s sleep takes intermediate hops (never gated, writing
    nothing), each keyed on the deadline, and completes on time."""
    world = await _faulty(tmp_path)
    app = make_app(world=world, WORKFLOW_WAIT_CONTINUATION_MAX_DELAY_SECONDS=0.3)

    @app.workflow
    async def flow() -> str:
        await sleep(1.0)
        return "rested"

    started = time.monotonic()
    run = await app.start(flow)
    assert await run.result(timeout=15) == "rested"
    assert time.monotonic() - started >= 1.0
    timers = [s for s in world.queue.sent if isinstance(s.message, messages.OrchestratorMessage)
              and s.message.wait_continuation is not None]  # fmt: skip
    hops = [s for s in timers if s.message.is_intermediate_hop]
    assert len(hops) >= 2
    assert len({s.key for s in timers}) == len(timers), "each hop sent once"
    deadline_ms = {s.message.wait_continuation.resume_at_ms for s in hops}
    assert len(deadline_ms) == 1, "every hop names the same deadline"
    types = [e.type for e in await run.events()]
    assert types.count("wait_completed") == 1


async def test_cancel_stops_a_chain_of_hops(tmp_path: Path, make_app: MakeApp) -> None:
    """C7: after a cancel, the next hop finds the run ended and sends no further hop."""
    world = await _faulty(tmp_path)
    app = make_app(world=world, WORKFLOW_WAIT_CONTINUATION_MAX_DELAY_SECONDS=0.2)

    @app.workflow
    async def flow() -> str:
        await sleep(30)
        return "never"

    run = await app.start(flow)
    deadline = time.monotonic() + 10
    while not any(s.message.is_intermediate_hop for s in world.queue.sent
                  if isinstance(s.message, messages.OrchestratorMessage)):  # fmt: skip
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    await run.cancel()
    hops_at_cancel = len(world.queue.sent)
    await asyncio.sleep(0.6)  # two hop lengths: asserting no further hop is sent
    with contextlib.suppress(RunCancelledError):
        await run.result(timeout=1)
    assert len(world.queue.sent) <= hops_at_cancel + 1, "at most the hop already in flight"
    assert "wait_completed" not in [e.type for e in await run.events()]


async def test_a_wake_with_nothing_new_acks_without_a_replay(make_app: MakeApp) -> None:
    """No-op wake: a plain first delivery whose log ends where this process left it."""
    app = make_app()
    replays: list[int] = []

    @app.workflow
    async def flow() -> str:
        replays.append(1)
        await sleep("1h")
        return "never"

    run = await app.start(flow)
    deadline = time.monotonic() + 10
    while "wait_created" not in [e.type for e in await run.events()]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)  # past the linger: the first delivery has acked
    before = len(replays)
    world = await app.world()
    record = await world.runs.get(run.run_id)
    for _ in range(3):
        await world.queue.send(
            messages.OrchestratorMessage(run_id=run.run_id, run_spec_version=record.spec_version)
        )
    await asyncio.sleep(0.6)  # the wakes are delivered within a dispatcher poll
    assert len(replays) == before, "the wakes found nothing new and replayed nothing"
    await run.cancel()


async def test_a_run_of_an_unknown_format_is_left_untouched(
    tmp_path: Path, make_app: MakeApp
) -> None:
    """H5: a run stamped with a spec version this worker lacks is not replayed or written."""
    world = await LocalWorld(tmp_path / "world", tuning=TUNING).open()
    app = make_app(world=world)

    @app.workflow
    async def flow() -> str:
        return "ran"

    run = await world.runs.create(
        workflow_name="flow", input={"args": [], "kwargs": {}}, deployment_id="local",
        spec_version=8,
    )  # fmt: skip
    await world.queue.send(messages.OrchestratorMessage(run_id=run.run_id, run_spec_version=8))
    await app.world()
    await asyncio.sleep(0.5)  # the delivery happens within a dispatcher poll
    after = await world.runs.get(run.run_id)
    assert after.status == "pending"
    assert after.seq == 1
