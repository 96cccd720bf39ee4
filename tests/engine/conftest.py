"""Fixtures for engine tests: a Workflows app on a fresh local World, tuned for speed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from treadle import Workflows, settings
from treadle.world import contract
from treadle.worlds.local import LocalWorld

from .faults import FaultyWorld

FAST = {
    "WORKFLOW_ORCHESTRATOR_LINGER_MS": 300,
    "WORKFLOW_ORCHESTRATOR_POLL_INTERVAL_MS": 200,
    "WORKFLOW_STEP_RETRY_DELAY_SECONDS": 0.05,
}
TUNING = contract.QueueTuning(lease_seconds=5.0, backoff_base_seconds=0.05, backoff_max_seconds=0.5)

MakeApp = Callable[..., Workflows]


@pytest.fixture
async def faulty(tmp_path: Path) -> FaultyWorld:
    """A fault-injecting wrapper around an open local World (closed by make_app's cleanup)."""
    inner = await LocalWorld(tmp_path / "world", tuning=TUNING).open()
    return FaultyWorld(inner)


@pytest.fixture
async def make_app(tmp_path: Path) -> AsyncIterator[MakeApp]:
    """``make_app(world=None, **settings)``: an app on ``tmp_path/world`` (opened lazily)."""
    apps: list[Workflows] = []

    def make(world: contract.World | None = None, **overrides: Any) -> Workflows:
        tuned = settings.load({}, **{**FAST, **overrides})
        app = Workflows(world=world or LocalWorld(tmp_path / "world", tuning=TUNING),
                        settings_=tuned, worker=True)  # fmt: skip
        apps.append(app)
        return app

    yield make
    for app in apps:
        await app.close(grace_seconds=2)
        world = app._world_arg
        if world is not None and not isinstance(world, str):
            await world.close()
