"""The World's side of a rollout: promote the new latest, retire drained revisions.

Called by ``deployments.reconcile`` once ``revisions.plan`` has decided.

- ``promote``: the revision the operator made ``latestRevision`` is promoted in the
  World (``Deployments.promote``), so the World's ``latest()`` (what
  ``start_on_latest`` chains start on) is the operator's latest, never a revision
  whose workers registered and then crash-loop (review R12). Promoted once per
  revision (``DeploymentRecord.promoted``), so WorkflowDeployments sharing a World
  do not take turns promoting on every tick.
- ``retire``: a revision the plan retires is retired in the World *first*; from then
  on the World refuses new runs on it (``DeploymentRetired``, review R1). Its active
  runs are counted again after that: a run recorded between the plan's count and the
  retire keeps the revision ``Draining`` with its workers, so it is served, and the
  revision retires on a later tick. Only then are its Deployments deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from treadle import errors as engine_errors
from treadle.world import contract
from treadle_operator import manifests, revisions
from treadle_operator.state import State

log = logging.getLogger("treadle.operator.rollout")


async def promote(
    world: contract.World, latest: str | None, own: frozenset[str] = frozenset()
) -> None:
    """Make the operator's latest the World's latest.

    Once per revision, unless the World's latest is another of ``own`` (this
    WorkflowDeployment's revisions): a rollback reuses a revision promoted before,
    and must be promoted again over the bad one. A newer revision of another
    WorkflowDeployment sharing the World is left latest (no taking turns).
    """
    if latest is None:
        return
    record = await world.deployments.get(latest)
    if record is not None and record.promoted:
        current = await world.deployments.latest()
        if current == latest or current not in own:
            return
    try:
        await world.deployments.promote(latest)
    except engine_errors.DeploymentRetired:
        log.warning("revision %s is retired in the World: not promoted", latest)
        return
    log.info("revision %s promoted: new runs on the World's latest start there", latest)


async def retire(
    state: State,
    namespace: str,
    world: contract.World,
    plan: revisions.Plan,
    active_runs: Callable[[contract.World, str], Awaitable[int]],
) -> revisions.Plan:
    """Retire the plan's drained revisions; the plan as it ends up (late runs keep one).

    ``active_runs`` counts a revision's runs that have not ended (``deployments``'s).
    """
    kept: list[str] = []
    for revision_id in plan.retire:
        await world.deployments.retire(revision_id)
        late = await active_runs(world, revision_id)
        if late:
            log.warning(
                "revision %s: %d run(s) recorded just before it retired; it drains first",
                revision_id,
                late,
            )
            kept.append(revision_id)
            continue
        for role in manifests.ROLES:
            await state.kube.delete_deployment(
                namespace, manifests.deployment_name(revision_id, role)
            )
        state.owners.pop(revision_id, None)
    if not kept:
        return plan
    status = plan.status.model_copy(
        update={
            "revisions": [
                r.model_copy(update={"phase": "Draining"}) if r.id in kept else r
                for r in plan.status.revisions
            ]
        }
    )
    return revisions.Plan(
        status=status,
        keep=(*plan.keep, *kept),
        retire=tuple(r for r in plan.retire if r not in kept),
        created=plan.created,
        changes=[c for c in plan.changes if not any(f"revision {k} is" in c for k in kept)],
    )
