"""``spec.revisions.<from>: {action: MoveRuns, to: <id>}`` (issue 11 item 5, ``pinned``).

Against the memory World, as the CancelRuns test: each run of a Draining revision whose
workflow declares the same non-empty ``compatible`` tag in both revisions' catalogues is
moved (``run_repinned``, the row's deployment, a recovery wake to the target); the others
stay and a Warning names why, once; never to a not-ready, unknown or retired revision.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import JsonValue

from treadle.testing.memory import MemoryBackend, MemoryWorld
from treadle.world import events, messages
from treadle_operator import pinned
from treadle_operator.models import RevisionStatus, WorkflowDeploymentSpec, WorkflowDeploymentStatus


def _entry(tag: str | None) -> JsonValue:
    entry: dict[str, JsonValue] = {"params": []}
    if tag is not None:
        entry["compatible"] = tag
    return entry


def _status(*, new_ready: bool = True) -> WorkflowDeploymentStatus:
    return WorkflowDeploymentStatus(
        latest_revision="new",
        revisions=[
            RevisionStatus(id="old", image="i:1", module="m", created_at="t", phase="Draining",
                           ready=True),
            RevisionStatus(id="new", image="i:2", module="m", created_at="t", phase="Active",
                           ready=new_ready),
        ],
    )  # fmt: skip


def _spec(revisions: dict[str, Any]) -> WorkflowDeploymentSpec:
    return WorkflowDeploymentSpec.model_validate(
        {"image": "i:2", "module": "m", "revisions": revisions}
    )


def test_move_runs_moves_only_compatible_runs_and_names_the_ones_left() -> None:
    """The tagged workflow's live runs move (and are woken on the new revision); an ended
    run, a run of a workflow whose tag changed and one of a workflow without a tag stay,
    and the warning about them is posted once, not every reconcile."""

    async def scenario() -> None:
        world = await MemoryWorld(MemoryBackend()).open()
        woken: list[messages.OrchestratorMessage] = []

        async def wake(message: Any, meta: messages.DeliveryMeta) -> messages.Ack:
            woken.append(message)
            return messages.ACK

        consumer = await world.queue.consume({"orchestrator": wake})
        try:
            catalogues = {
                rev: {"order": _entry("orders-v3"), "refund": _entry(tag), "plain": _entry(None)}
                for rev, tag in (("old", "r1"), ("new", "r2"))
            }
            for rev, cat in catalogues.items():
                await world.deployments.register(rev, catalogue=cat)

            async def run(workflow: str) -> str:
                made = await world.runs.create(
                    workflow_name=workflow, input=None, deployment_id="old", spec_version=9
                )
                return made.run_id

            orders = [await run("order"), await run("order")]
            refund, plain, ended = await run("refund"), await run("plain"), await run("order")
            await world.events.create(ended, events.RunCancelled(reason="x"), in_band=False)
            spec = _spec({"old": {"action": "MoveRuns", "to": "new", "reason": "hotfix"}})
            notes = await pinned.act(world, spec, _status(), namespace="ns", name="mv")
            assert notes[0] == ("revision old: 2 pinned run(s) moved to revision new (hotfix)",
                                False)  # fmt: skip
            warnings = sorted(text for text, warning in notes if warning)
            assert len(warnings) == 2
            assert (
                "1 run(s) stay on revision old: workflow plain declares no compatibility "
                "tag in deployment old" in warnings[0]
            )
            assert "compatible='r1' in deployment old but compatible='r2'" in warnings[1]
            for run_id in orders:
                record = await world.runs.get(run_id)
                assert record.deployment_id == "new"
                log = (await world.events.list(run_id)).events
                assert log[-1].type == "run_repinned"
            for run_id in (refund, plain, ended):
                assert (await world.runs.get(run_id)).deployment_id == "old"
            for _ in range(200):
                if len(woken) >= 2:
                    break
                await asyncio.sleep(0.01)
            assert sorted(m.run_id for m in woken) == sorted(orders)
            assert all(m.recovery and m.deployment_id == "new" for m in woken)
            again = await pinned.act(world, spec, _status(), namespace="ns", name="mv")
            assert again == [], "nothing left to move, and the runs left were reported once"
        finally:
            pinned.forget("ns", "mv")
            await consumer.close(grace_seconds=1)
            await world.close()

    asyncio.run(scenario())


def test_move_runs_never_targets_a_revision_that_cannot_serve() -> None:
    """A not-ready target, one that is not this object's, a missing ``to`` and a retired
    deployment are refused with a Warning naming the field; no run moves."""

    async def scenario() -> None:
        world = await MemoryWorld(MemoryBackend()).open()
        try:
            for rev in ("old", "new"):
                await world.deployments.register(rev, catalogue={"order": _entry("v")})
            run = await world.runs.create(
                workflow_name="order", input=None, deployment_id="old", spec_version=9
            )
            cases = [
                ({"action": "MoveRuns", "to": "new"}, _status(new_ready=False), "is not ready"),
                ({"action": "MoveRuns", "to": "elsewhere"}, _status(), "not a live revision"),
                ({"action": "MoveRuns"}, _status(), "`to` must name another revision"),
            ]
            for index, (action, status, expected) in enumerate(cases):
                notes = await pinned.act(
                    world, _spec({"old": action}), status, namespace="ns", name=f"n{index}"
                )
                assert len(notes) == 1 and notes[0][1] is True, notes
                assert "spec.revisions[old]: MoveRuns refused: " in notes[0][0]
                assert expected in notes[0][0]
                pinned.forget("ns", f"n{index}")
            await world.deployments.retire("new")
            notes = await pinned.act(
                world, _spec({"old": {"action": "MoveRuns", "to": "new"}}), _status(),
                namespace="ns", name="retired",
            )  # fmt: skip
            assert notes == [(
                "spec.revisions[old]: MoveRuns refused: deployment new is retired", True
            )]  # fmt: skip
            assert (await world.runs.get(run.run_id)).deployment_id == "old"
        finally:
            pinned.forget("ns", "retired")
            await world.close()

    asyncio.run(scenario())
