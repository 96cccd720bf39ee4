"""Turbo (seed 003): the start message's first delivery skips the log load and does not
wait for ``run_started`` before replaying; every later write still queues behind it.
Under ``WORKFLOW_OPTIMISTIC_INLINE_START=0`` an inline body starts only once its own
``step_started`` committed; by default it starts before (tests/engine/
test_optimistic_starts.py proves that ordering on both Worlds)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from treadle import Workflows, settings
from treadle.world import events, records
from treadle.worlds.local import LocalWorld

HOLD_SECONDS = 10.0


class HeldRunStarted:
    """Forwards to a LocalWorld, but holds the ``run_started`` write until ``release``."""

    def __init__(self, world: LocalWorld) -> None:
        self._world = world
        self.release = asyncio.Event()
        self.released_in_time: list[bool] = []
        self.events = self
        for name in ("capabilities", "runs", "steps", "hooks", "deployments", "queue"):
            setattr(self, name, getattr(world, name))

    async def create(self, run_id: str, event: events.Event, **kw: Any) -> records.EventResult:
        if event.type == "run_started":
            try:
                await asyncio.wait_for(self.release.wait(), HOLD_SECONDS)
                self.released_in_time.append(True)
            except TimeoutError:
                self.released_in_time.append(False)
        return await self._world.events.create(run_id, event, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._world.events, name)

    async def close(self) -> None:
        await self._world.close()


@pytest.mark.parametrize("optimistic", ["default", "0"])
async def test_the_first_delivery_replays_while_run_started_is_in_flight(
    tmp_path: Path, optimistic: str
) -> None:
    world = HeldRunStarted(await LocalWorld(tmp_path / "w").open())
    # Run-ahead (branch ra) off: it starts a body before its start too.
    tuned: dict[str, Any] = {"WORKFLOW_RUN_AHEAD_DEPTH": 0}
    if optimistic != "default":
        tuned["WORKFLOW_OPTIMISTIC_INLINE_START"] = optimistic
    app = Workflows(world=world, settings_=settings.load({}, **tuned), worker=True)  # type: ignore[arg-type]
    seen_by_body: list[str] = []

    @app.step
    async def first() -> str:
        seen_by_body.extend(e.type for e in await run.events())
        return "done"

    @app.workflow
    async def flow() -> str:
        world.release.set()  # workflow code ran: the replay did not wait for run_started
        return await first()

    try:
        run = await app.start(flow)
        assert await run.result(timeout=30) == "done"
        logged = [e.type for e in await run.events()]
    finally:
        await app.close(grace_seconds=2)
        await world.close()
    assert world.released_in_time == [True]
    assert logged == [
        "run_created",
        "run_started",
        "step_started",
        "step_completed",
        "run_completed",
    ]
    if optimistic == "0":
        assert seen_by_body == ["run_created", "run_started", "step_started"]
    else:  # started before its start committed: what it read is racing its own writes
        assert "step_completed" not in seen_by_body
