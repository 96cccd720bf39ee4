"""Fixtures for engine tests: a Workflows app on a fresh local World, tuned for speed."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from treadle import Workflows, settings
from treadle.world import contract
from treadle.worlds.local import LocalWorld

from ..nats.conftest import nats_server
from ..postgres.conftest import pg_clones, pg_dsn, pg_server
from .faults import FaultyWorld

__all__ = ["nats_server", "pg_clones", "pg_dsn", "pg_server"]

FAST = {
    "WORKFLOW_ORCHESTRATOR_LINGER_MS": 300,
    "WORKFLOW_ORCHESTRATOR_POLL_INTERVAL_MS": 200,
    "WORKFLOW_STEP_RETRY_DELAY_SECONDS": 0.05,
}
TUNING = contract.QueueTuning(lease_seconds=5.0, backoff_base_seconds=0.05, backoff_max_seconds=0.5)

MakeApp = Callable[..., Workflows]


# ``open_world()`` opens the World under test with TUNING; ``open_world(tuning)`` with
# another queue tuning (a short lease, for the overlap tests). On Postgres + NATS,
# ``open_world(deployment_id=...)`` opens a World consuming that deployment's subjects
# (the local World takes no deployment_id: one local World serves every deployment).
OpenWorld = Callable[..., Awaitable[Any]]


# A module marked ``pytestmark = BOTH_FORMATS`` runs each of its tests four ways: spec 9
# and spec 8, each on both Worlds (issue 12 "Done when": the engine suites on both formats
# and both Worlds); each app of the test mints its runs in that format.
WORLD_CASES = ["local", "postgres+nats"]
SPEC8_CASES = ["local-spec8", "postgres+nats-spec8"]
BOTH_FORMATS = pytest.mark.parametrize("open_world", [*WORLD_CASES, *SPEC8_CASES], indirect=True)


@pytest.fixture(params=WORLD_CASES)
def open_world(request: pytest.FixtureRequest, tmp_path: Path) -> OpenWorld:
    """Opens the World under test: the local one, or Postgres + NATS on real servers.
    ``local-spec8`` / ``postgres+nats-spec8``: that World, with the test's apps minting
    spec 8 runs (its opener's ``spec_version``)."""
    if request.param == "local-spec8":

        async def local8(tuning: contract.QueueTuning | None = None) -> Any:
            return await LocalWorld(tmp_path / "world", tuning=tuning or TUNING).open()

        local8.spec_version = 8  # type: ignore[attr-defined]
        return local8
    if request.param == "local":

        async def local(tuning: contract.QueueTuning | None = None) -> Any:
            return await LocalWorld(tmp_path / "world", tuning=tuning or TUNING).open()

        return local
    from ..production.conftest import ProductionHarness

    harness = ProductionHarness(
        request.getfixturevalue("pg_dsn"), request.getfixturevalue("nats_server").url, "local"
    )

    async def production(
        tuning: contract.QueueTuning | None = None, *, deployment_id: str | None = None
    ) -> Any:
        if deployment_id is None:
            return await harness.open(tuning or TUNING)
        # Another deployment's World on the same database and stream (its own consumers).
        other = copy.copy(harness)
        other.deployment_id = deployment_id
        return await other.open(tuning or TUNING)

    if request.param == "postgres+nats-spec8":
        production.spec_version = 8  # type: ignore[attr-defined]
    return production


@pytest.fixture
def spec_version(open_world: OpenWorld) -> int:
    """The format the test's apps mint: 8 under ``local-spec8``, else 9."""
    return int(getattr(open_world, "spec_version", 9))


@pytest.fixture
async def faulty(open_world: OpenWorld) -> FaultyWorld:
    """A fault-injecting wrapper around an open World (closed by make_app's cleanup)."""
    return FaultyWorld(await open_world())


@pytest.fixture
async def make_app(open_world: OpenWorld) -> AsyncIterator[MakeApp]:
    """``make_app(world=None, **settings)``: an app on the World under test."""
    apps: list[Workflows] = []

    minted = getattr(open_world, "spec_version", None)

    def make(world: contract.World | None = None, **overrides: Any) -> Workflows:
        if minted is not None:
            overrides.setdefault("WORKFLOW_SPEC_VERSION", minted)
        tuned = settings.load({}, **{**FAST, **overrides})
        app = Workflows(world=world or _Lazy(open_world), settings_=tuned, worker=True)  # type: ignore[arg-type]
        apps.append(app)
        return app

    yield make
    for app in apps:
        await app.close(grace_seconds=2)
        world = app._world_arg
        if world is not None and not isinstance(world, str):
            await world.close()


class _Lazy:
    """A World opened when the app first needs it (``Workflows`` calls ``open``)."""

    def __init__(self, opener: OpenWorld) -> None:
        self._opener = opener
        self._world: Any = None

    async def open(self) -> Any:
        if self._world is None:
            self._world = await self._opener()
            for name in (
                "capabilities",
                "runs",
                "events",
                "steps",
                "hooks",
                "deployments",
                "queue",
                "changes",
                "schedules",
                "limits",  # concurrency and rate limits (issue 17 item 4)
            ):
                setattr(self, name, getattr(self._world, name))
            if hasattr(self._world, "heartbeats"):  # optional (step heartbeats, issue 17)
                self.heartbeats = self._world.heartbeats
            if hasattr(self._world, "streams"):  # issue 17 item 6
                self.streams = self._world.streams
        return self._world

    async def close(self) -> None:
        if self._world is not None:
            await self._world.close()
