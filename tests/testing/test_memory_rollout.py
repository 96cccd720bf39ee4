"""A start racing a rollout (review R1), on the in-memory World with its fault points.

The timeline: a ``start_on_latest`` start reads the latest deployment ("blue"); before
its ``runs.create`` lands, the operator (another process on the same backend) promotes
"green" and retires "blue". The World refuses the create (``DeploymentRetired``,
nothing recorded) and the start reads the new latest and records the run there.
"""

from __future__ import annotations

import pytest

from treadle import Workflows, errors, settings
from treadle.testing.memory import Interference, MemoryBackend, MemoryWorld


class RolloutBeforeCreate:
    """At the first runs.create, the operator rolls blue out to green."""

    def __init__(self, operator: MemoryWorld) -> None:
        self.operator = operator
        self.rolled = False

    async def before(self, point: str, run_id: str | None) -> Interference:
        if point == "runs.create" and not self.rolled:
            self.rolled = True
            await self.operator.deployments.register("green", catalogue={"chain": {}})
            await self.operator.deployments.promote("green")
            await self.operator.deployments.retire("blue")
        return "proceed"


async def test_a_start_on_latest_refused_on_a_just_retired_revision_starts_on_the_new_latest() -> (
    None
):
    """R1: the run is recorded on green, and nothing on blue."""
    backend = MemoryBackend()
    operator = MemoryWorld(backend)
    await operator.deployments.register("blue", catalogue={"chain": {}})
    await operator.deployments.promote("blue")
    interceptor = RolloutBeforeCreate(operator)
    world = MemoryWorld(backend, interceptor=interceptor)
    app = Workflows(world=world, settings_=settings.load({}, TREADLE_DEPLOYMENT_ID="starter"))

    @app.workflow(start_on_latest=True)
    async def chain() -> str:
        return "next"

    run = await app.start(chain)
    assert interceptor.rolled
    assert (await run.get()).deployment_id == "green"
    assert (await operator.runs.list(deployment_id="blue")).runs == ()


async def test_a_start_pinned_to_a_retired_deployment_is_refused_with_nothing_recorded() -> None:
    """R1: a workflow that is not start_on_latest has nowhere else to go: the error says so."""
    backend = MemoryBackend()
    world = MemoryWorld(backend)
    await world.deployments.register("starter")
    await world.deployments.retire("starter")
    app = Workflows(world=world, settings_=settings.load({}, TREADLE_DEPLOYMENT_ID="starter"))

    @app.workflow
    async def pinned() -> str:
        return "here"

    with pytest.raises(errors.DeploymentRetired, match="deployment starter is retired"):
        await app.start(pinned)
    assert (await world.runs.list()).runs == ()
