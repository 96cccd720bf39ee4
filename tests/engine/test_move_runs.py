"""Moving a sleeping run to another deployment revision (issue 11 item 5, ``treadle.moves``).

A run sleeps on deployment A; A's worker stops (the revision is being retired, its
timer for the sleep scheduled on A's subject); B, a second app object with the same
workflow and the same ``compatible`` tag, serves. ``move_run`` repins the run to B and
sends B a recovery wake: B's orchestrator replays the log A wrote, re-arms the sleep
and finishes the run, no earlier than the sleep's end. A move between different tags is
refused and leaves the run where it was (docs/operator-templates.md, "Moving pinned
runs"). Both Worlds: local, and Postgres + NATS (where each deployment has its own
subjects, so nothing of A's reaches B unless the move re-arms it).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from treadle import Hook, Workflows, errors, moves, sleep
from treadle.sdk import catalogue
from treadle.world import contract, events
from treadle.worlds.local import LocalWorld

from .conftest import MakeApp, OpenWorld

SLEEP_SECONDS = 4.0


def _serve(app: Workflows, ran: list[tuple[str, str]], tag: str | None) -> None:
    """The workflow every revision here serves: a step, a durable sleep, a step."""
    where = app.settings.TREADLE_DEPLOYMENT_ID

    @app.step
    async def mark(label: str) -> str:
        ran.append((label, where))
        return label

    @app.workflow(name="order", compatible=tag)
    async def order(order_id: str) -> str:
        await mark("before")
        await sleep(SLEEP_SECONDS)
        await mark("after")
        return f"shipped {order_id}"


async def _worlds(open_world: OpenWorld, *, both: bool = True) -> tuple[Any, Any]:
    """A's World and B's: one local World serves both; on Postgres + NATS each deployment's
    World consumes its own subjects (so A's timer never reaches B by itself)."""
    first = await open_world()
    if isinstance(first, LocalWorld):
        return first, first
    await first.close()
    world_a = await open_world(deployment_id="orders-a")
    return world_a, (await open_world(deployment_id="orders-b") if both else None)


async def _until_sleeping(world: contract.World, run_id: str) -> events.WaitCreated:
    """The run's wait_created, once A's orchestrator has written it (read until it is)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while True:
        page = await world.events.list(run_id)
        for logged in page.events:
            if isinstance(logged.event, events.WaitCreated):
                return logged.event
        if loop.time() > deadline:
            raise AssertionError(f"run {run_id} never slept: {[e.type for e in page.events]}")
        await asyncio.sleep(0.05)


async def test_a_sleeping_run_moved_to_a_compatible_revision_finishes_there(
    open_world: OpenWorld, make_app: MakeApp
) -> None:
    """Issue 11 item 5: repin + recovery wake; B replays A's log (no step runs again),
    honours the sleep A started, and completes the run; A is stopped before the move."""
    world, world_b = await _worlds(open_world)
    ran: list[tuple[str, str]] = []
    app_a = make_app(world=world, TREADLE_DEPLOYMENT_ID="orders-a")
    _serve(app_a, ran, "orders-v3")
    run = await app_a.start("order", "o-1")
    wait = await _until_sleeping(world, run.run_id)
    assert wait.resume_at is not None
    await app_a.close(grace_seconds=2)  # A's worker stops; its timer sits on A's subject

    app_b = make_app(world=world_b, TREADLE_DEPLOYMENT_ID="orders-b")
    _serve(app_b, ran, "orders-v3")
    await app_b.world()  # B's worker registers its catalogue, tag included
    b = await world.deployments.get("orders-b")
    assert b is not None and catalogue.compatible_of(b.catalogue["order"]) == "orders-v3"  # type: ignore[index]

    moved = await moves.move_run(world, run.run_id, to_deployment="orders-b", reason="test")
    assert (moved.outcome, moved.from_deployment) == ("moved", "orders-a")
    assert moved.run.deployment_id == "orders-b"

    assert await app_b.get_run(run.run_id).result(timeout=30) == "shipped o-1"
    assert ran == [("before", "orders-a"), ("after", "orders-b")]
    log = await app_b.get_run(run.run_id).events()
    repinned = [e for e in log if isinstance(e.event, events.RunRepinned)]
    assert [(e.event.from_deployment, e.event.to_deployment) for e in repinned] == [  # type: ignore[union-attr]
        ("orders-a", "orders-b")
    ]
    completed = [e for e in log if e.type == "wait_completed"]
    assert len(completed) == 1
    assert completed[0].created_at >= wait.resume_at  # the sleep was honoured, not cut short
    assert (await world.runs.get(run.run_id)).deployment_id == "orders-b"
    # A second move of the same run converges (it is on B already): one wake, no new event.
    again = await moves.move_run(world, run.run_id, to_deployment="orders-b")
    assert again.outcome == "already_there"


@pytest.mark.parametrize("tag_b", ["orders-v4", None], ids=["another-tag", "no-tag"])
async def test_a_move_between_different_tags_is_refused_and_the_run_stays(
    open_world: OpenWorld, make_app: MakeApp, tag_b: str | None
) -> None:
    """No shared compatibility tag: RunNotMovable, nothing written, the run finishes on A."""
    world, _ = await _worlds(open_world, both=False)
    ran: list[tuple[str, str]] = []
    app_a = make_app(world=world, TREADLE_DEPLOYMENT_ID="orders-a")
    _serve(app_a, ran, "orders-v3")
    run = await app_a.start("order", "o-2")
    await _until_sleeping(world, run.run_id)
    # What B's worker registers when it starts (Worker.start), without a second consumer.
    other = Workflows()
    _serve(other, [], tag_b)
    tags: dict[str, Any] = {n: wf.compatible for n, wf in other.workflows.items()}
    await world.deployments.register(
        "orders-b",
        catalogue=catalogue.describe({n: wf.fn for n, wf in other.workflows.items()}, tags),
    )
    before = await world.runs.get(run.run_id)
    with pytest.raises(errors.RunNotMovable, match="compatib") as refused:
        await moves.move_run(world, run.run_id, to_deployment="orders-b")
    assert refused.value.workflow == "order"
    after = await world.runs.get(run.run_id)
    assert (after.deployment_id, after.seq) == ("orders-a", before.seq)
    assert await run.result(timeout=30) == "shipped o-2"
    assert ran == [("before", "orders-a"), ("after", "orders-a")]


class Go(Hook):
    ok: bool


async def test_a_run_moved_while_its_old_orchestrator_lingers_on_it_continues_on_the_new(
    open_world: OpenWorld, make_app: MakeApp
) -> None:
    """Found by tests/k8s/test_operator_moves.py: a delivery lingering on a run (a hook is
    open: WORKFLOW_ORCHESTRATOR_LINGER_MS) took the events written after the move and ran
    the next step on the old code. Now a delivery that reads ``run_repinned`` stops and
    re-routes; the step after the hook runs on B while A's worker is still up."""
    first = await open_world()
    if isinstance(first, LocalWorld):
        await first.close()
        # One local queue feeds every worker on it: two deployments' workers on one local
        # World re-route each other's messages, so only Postgres + NATS has the scenario.
        pytest.skip(
            "local World: one local queue feeds every worker on it, so two live "
            "deployments' workers re-route each other's messages; the scenario needs "
            "Postgres + NATS"
        )
    await first.close()
    world_a = await open_world(deployment_id="orders-a")
    world_b = await open_world(deployment_id="orders-b")
    ran: list[tuple[str, str]] = []

    def serve(app: Workflows) -> None:
        where = app.settings.TREADLE_DEPLOYMENT_ID

        @app.step
        async def mark(label: str) -> str:
            ran.append((label, where))
            return label

        @app.workflow(name="approve", compatible="approve-v1")
        async def approve(order_id: str) -> str:
            await mark("before")
            answer = await Go.wait(token=f"go:{order_id}")
            await mark("after")
            return f"{order_id}:{answer.ok}"

    app_a = make_app(world=world_a, TREADLE_DEPLOYMENT_ID="orders-a",
                     WORKFLOW_ORCHESTRATOR_LINGER_MS=20000)  # fmt: skip
    serve(app_a)
    app_b = make_app(world=world_b, TREADLE_DEPLOYMENT_ID="orders-b")
    serve(app_b)
    await app_b.world()
    run = await app_a.start("approve", "o-3")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while not any(e.type == "hook_created" for e in (await world_a.events.list(run.run_id)).events):
        assert loop.time() < deadline, "the run never opened its hook"
        await asyncio.sleep(0.05)
    await moves.move_run(world_b, run.run_id, to_deployment="orders-b")
    await app_b.resume_hook("go:o-3", {"ok": True})
    assert await app_b.get_run(run.run_id).result(timeout=30) == "o-3:True"
    assert ran == [("before", "orders-a"), ("after", "orders-b")]
