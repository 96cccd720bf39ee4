"""Deployment pinning: start_on_latest, and a run whose deployment is gone (seed 004)."""

from __future__ import annotations

import time

import pytest

from treadle.errors import RunFailedError
from treadle.world import messages

from .conftest import MakeApp


async def test_start_on_latest_starts_new_runs_on_the_latest_deployment(
    make_app: MakeApp,
) -> None:
    """A StartOnLatest workflow's new runs are pinned to the newest deployment, not the
    starter's; other workflows stay on the starter's."""
    app = make_app()  # deployment "local", registered by its worker

    @app.workflow(start_on_latest=True)
    async def chain() -> str:
        return "next"

    @app.workflow
    async def pinned() -> str:
        return "here"

    world = await app.world()
    await world.deployments.register("new")
    moved = await app.start(chain)
    stayed = await app.start(pinned)
    assert (await moved.get()).deployment_id == "new"
    assert (await stayed.get()).deployment_id == "local"
    assert await stayed.result(timeout=10) == "here"


async def test_a_run_whose_deployment_is_gone_fails_at_once(make_app: MakeApp) -> None:
    """A delivery for a run pinned to a retired deployment is not replayed and not re-sent:
    the run fails with DeploymentMismatch straight away."""
    app = make_app()
    replayed: list[int] = []

    @app.workflow
    async def flow() -> str:
        replayed.append(1)
        return "ran"

    world = await app.world()
    await world.deployments.register("blue")
    run = await world.runs.create(
        workflow_name="flow", input={"args": [], "kwargs": {}}, deployment_id="blue",
        spec_version=9,
    )  # fmt: skip
    # Retired after the run was recorded (a new run on it is refused: DeploymentRetired).
    await world.deployments.retire("blue")
    started = time.monotonic()
    await world.queue.send(messages.OrchestratorMessage(run_id=run.run_id, run_spec_version=9))
    with pytest.raises(RunFailedError, match="is gone"):
        await app.get_run(run.run_id).result(timeout=20)
    assert time.monotonic() - started < 5, "no 1, 2, 4 s re-routes for a gone deployment"
    assert replayed == []
