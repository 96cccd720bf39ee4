"""Deleting a WorkflowDeployment: ``spec.deletionPolicy`` (review operator.md R7).

Deleting a WorkflowDeployment used to retire every revision at once and let the
garbage collector remove the workers, stranding every sleeping or pending run
on it for good. Now the policy decides, and the finalizer holds the object
until it is done:

- ``Wait`` (the default): while runs are active on any of its revisions, the
  object stays (finalizer kept) with a condition ``Deleting`` True, reason
  ``RunsActive``, saying how many; its workers stay up and serve them; it takes
  no new runs (``runs.start`` answers ``DeploymentDeleting``). When the last run
  ends, the revisions are retired in the World and the object goes (its worker
  Deployments with it, by owner reference).
- ``Cancel``: every active run is cancelled through the World (``run_cancelled``,
  as ``kubectl delete wfr`` does), then as ``Wait`` (nothing is left to wait for).
- ``Orphan``: goes at once, as before; the runs stay recorded but stall (no
  workers serve their revision any more). A Warning Event ``RunsOrphaned`` says
  how many.

The World unreachable, ``Wait`` and ``Cancel`` keep the finalizer and try again
(with backoff, the condition saying why); the World's Secret gone (the namespace
is being deleted, most often) lets go with a Warning Event, as nothing could ever
count or cancel those runs. kopf stops the reconcile timer of an object being
deleted, so this handler polls itself: one ``runs.count`` per live revision every
``TREADLE_OPERATOR_RECONCILE_SECONDS``. It runs inside kopf's delete handler and
never raises a ``TemporaryError`` (no error log and Event per poll); after an
operator restart kopf calls it again and it picks up where it was.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from treadle import errors as engine_errors
from treadle.world import contract, events
from treadle_operator import deployments, models
from treadle_operator.conditions import condition, merge_conditions
from treadle_operator.errors import WorldSecretMissing, WorldUnavailable
from treadle_operator.models import WorkflowDeploymentSpec, WorkflowDeploymentStatus
from treadle_operator.starts import backoff
from treadle_operator.state import State

log = logging.getLogger("treadle.operator.teardown")

PLURAL = "workflowdeployments"
DELETING = "Deleting"
CANCEL_REASON = "its WorkflowDeployment was deleted (deletionPolicy Cancel)"


def serving(body: dict[str, Any]) -> bool:
    """A ready revision, a reachable World, not being deleted: runs can start on it."""
    status = models.parse_status(WorkflowDeploymentStatus, body.get("status"))
    if (body.get("metadata") or {}).get("deletionTimestamp") or not status.latest_revision:
        return False
    world = next((c for c in status.conditions if c.type == "WorldReachable"), None)
    return world is None or world.status == "True"


def live_revisions(body: dict[str, Any]) -> list[str]:
    status = models.parse_status(WorkflowDeploymentStatus, body.get("status"))
    return [r.id for r in status.revisions if r.phase != "Retired"]


async def count_active(world: contract.World, revisions: list[str]) -> int:
    return sum([await deployments.active_runs(world, r) for r in revisions])


async def cancel_active(world: contract.World, revisions: list[str]) -> int:
    """Cancel every run not ended on these revisions; how many were cancelled."""
    cancelled = 0
    for revision in revisions:
        for status in deployments.ACTIVE_STATUSES:
            cursor: str | None = None
            while True:
                page = await world.runs.list(
                    status=status, deployment_id=revision, limit=500, cursor=cursor
                )
                for run in page.runs:
                    try:
                        await world.events.create(
                            run.run_id, events.RunCancelled(reason=CANCEL_REASON), in_band=False
                        )
                    except (engine_errors.RunExpired, engine_errors.WorldContractError):
                        continue  # it ended meanwhile
                    cancelled += 1
                    log.info("run %s cancelled: %s", run.run_id, CANCEL_REASON)
                cursor = page.next_cursor
                if cursor is None:
                    break
    return cancelled


async def delete(state: State, body: dict[str, Any]) -> None:
    """Apply the object's ``deletionPolicy``; returns when the finalizer may go."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    spec = WorkflowDeploymentSpec.model_validate(body.get("spec") or {})
    revisions = live_revisions(body)
    if spec.deletion_policy == "Orphan" or not revisions:
        await _orphan(state, body, spec, revisions)
        return
    interval = state.settings.TREADLE_OPERATOR_RECONCILE_SECONDS
    cap = max(interval, state.settings.TREADLE_OPERATOR_RETRY_MAX_SECONDS)
    failures = 0
    announced = False
    while True:
        try:
            world = await state.worlds.get(namespace, spec.world)
            if spec.deletion_policy == "Cancel":
                cancelled = await cancel_active(world, revisions)
                if cancelled:
                    await state.kube.event(
                        body, "RunsCancelled", f"{cancelled} active runs cancelled (deletionPolicy)"
                    )
            active = await count_active(world, revisions)
        except WorldSecretMissing as exc:
            message = f"the World cannot be reached ({exc}): its runs are left as they are"
            await state.kube.event(body, "RunsOrphaned", message, warning=True)
            log.warning("WorkflowDeployment %s/%s deleted: %s", namespace, name, message)
            return
        except (WorldUnavailable, engine_errors.StorageUnavailable) as exc:
            failures += 1
            await _say(state, body, "WorldUnavailable", f"cannot count its active runs: {exc}")
            await asyncio.sleep(backoff(failures, interval, cap))
            continue
        failures = 0
        if active == 0:
            break
        if not announced:
            announced = True
            await state.kube.event(
                body,
                "Deleting",
                f"waiting for {active} active runs to end before going (deletionPolicy "
                f"{spec.deletion_policy})",
            )
        await _say(
            state,
            body,
            "RunsActive",
            f"{active} runs still active on revisions {', '.join(revisions)}; the workers stay "
            "until they end (deletionPolicy Wait)",
        )
        await asyncio.sleep(interval)
    await deployments.retire_all(state, body)
    log.info("WorkflowDeployment %s/%s: no active runs left, retired and let go", namespace, name)


async def _orphan(
    state: State, body: dict[str, Any], spec: WorkflowDeploymentSpec, revisions: list[str]
) -> None:
    meta = body["metadata"]
    if revisions:
        try:
            world = await state.worlds.get(meta["namespace"], spec.world)
            active = await count_active(world, revisions)
        except Exception as exc:  # Orphan never waits on the World
            log.warning("WorkflowDeployment %s/%s: cannot count runs: %s", meta["namespace"],
                        meta["name"], exc)  # fmt: skip
            active = 0
        if active:
            await state.kube.event(
                body,
                "RunsOrphaned",
                f"{active} active runs left on revisions {', '.join(revisions)}: with no "
                "workers they stall (deletionPolicy Orphan)",
                warning=True,
            )
    await deployments.retire_all(state, body)


async def _say(state: State, body: dict[str, Any], reason: str, message: str) -> None:
    """``Deleting`` True with this reason and message (patched only when they change)."""
    meta = body["metadata"]
    async with state.lock(meta["uid"]):
        fresh = await state.kube.get(PLURAL, meta["namespace"], meta["name"])
        if fresh is None:
            return
        status = models.parse_status(WorkflowDeploymentStatus, fresh.get("status"))
        before = next((c for c in status.conditions if c.type == DELETING), None)
        if before is not None and (before.reason, before.message) == (reason, message):
            return
        generation = (fresh.get("metadata") or {}).get("generation")
        saying = condition(DELETING, True, reason, message).model_copy(
            update={"observed_generation": generation}
        )
        conditions = merge_conditions(status.conditions, [saying]) + [
            c for c in status.conditions if c.type != DELETING
        ]
        await state.kube.patch_status(
            PLURAL,
            meta["namespace"],
            meta["name"],
            {"conditions": [models.dump(c) for c in conditions]},
        )
