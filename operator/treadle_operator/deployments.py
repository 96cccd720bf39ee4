"""Reconciling a WorkflowDeployment: revisions, their workers, its status.

``reconcile`` looks at what is (the World, each revision's Deployments and
Pods, how many runs each revision still has), asks ``revisions.plan`` what
should be, makes the worker Deployments match, retires drained revisions in
the World, and records the status with conditions. It runs when the object
changes and every ``TREADLE_OPERATOR_RECONCILE_SECONDS``; it is idempotent, so
a retried or overlapping call converges.

While the World cannot be reached, nothing is retired: a revision's active-run
count is unknown, and removing the pods a run is pinned to would strand it.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from treadle.world import contract
from treadle.world.records import RunStatus
from treadle_operator import (
    kube,
    manifests,
    metrics,
    models,
    pinned,
    podsecurity,
    podtemplate,
    recovery,
    revisions,
    rollout,
    specmint,
    transport,
    workers,
)
from treadle_operator.conditions import condition, merge_conditions
from treadle_operator.errors import (
    DeploymentRefused,
    WorldHostRefused,
    WorldSecretForbidden,
    WorldSecretMissing,
    WorldSecretUnreadable,
    WorldUnavailable,
)
from treadle_operator.models import (
    RevisionStatus,
    WorkflowDeploymentSpec,
    WorkflowDeploymentStatus,
)
from treadle_operator.state import MIRROR_TTL_SECONDS, Owner, State

log = logging.getLogger("treadle.operator.deployments")
HASH = podtemplate.HASH_ANNOTATION

ACTIVE_STATUSES: tuple[RunStatus, ...] = ("pending", "running")
COUNT_LIMIT = 100_000


async def active_runs(world: contract.World, deployment_id: str) -> int:
    """Runs on ``deployment_id`` that have not ended (counted up to ``COUNT_LIMIT``), in one
    query (``runs.count``), never a page walk (review R5 (c))."""
    return await world.runs.count(
        statuses=ACTIVE_STATUSES, deployment_id=deployment_id, limit=COUNT_LIMIT
    )


async def steps_replicas(world: contract.World, spec: WorkflowDeploymentSpec, revision: str) -> int:
    """The step workers' replicas: fixed, or from the queue's step backlog when autoscaled."""
    scale = spec.steps.autoscale
    if scale is None:
        return spec.steps.replicas
    pending = await world.queue.backlog("step", revision)
    wanted = math.ceil(pending / scale.pending_per_replica)
    return max(scale.min_replicas, min(scale.max_replicas, wanted))


async def _observe(
    state: State,
    namespace: str,
    world: contract.World,
    revision: RevisionStatus,
    seen: workers.Workers,
) -> revisions.Observed:
    record = await world.deployments.get(revision.id)
    # Ready means the workers run and have told the World what they serve.
    registered = record is not None and record.catalogue is not None
    return workers.observed(seen, revision, registered, await active_runs(world, revision.id))


async def reconcile(state: State, body: dict[str, Any]) -> None:
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    spec = WorkflowDeploymentSpec.model_validate(body.get("spec") or {})
    status = models.parse_status(WorkflowDeploymentStatus, body.get("status"))
    status = await recovery.rebuild(state, namespace, name, uid, status)
    # Reserved: every name the operator may set, the transport keys' included.
    every_key = frozenset(transport.SECRET_KEYS)
    refused = podsecurity.reserved_env(spec, manifests.operator_env(spec, "-", every_key))
    if refused is not None:
        await _refuse(state, body, status, refused)
        return
    refused = manifests.template_refusal(spec, every_key)
    if refused is not None:
        await _refuse(state, body, status, refused, reason="InvalidTemplate")
        return
    refused = specmint.refusal(spec)
    if refused is not None:
        await _refuse(state, body, status, refused, reason="InvalidSpecVersion")
        return
    try:
        world = await state.worlds.get(namespace, spec.world)
    except WorldUnavailable as exc:
        reason = (
            "SecretUnreadable"
            if isinstance(exc, WorldSecretUnreadable)
            else "SecretMissing"
            if isinstance(exc, WorldSecretMissing)
            else "SecretForbidden"
            if isinstance(exc, WorldSecretForbidden)
            else "HostNotAllowed"
            if isinstance(exc, WorldHostRefused)
            else "Unreachable"
        )
        conditions = merge_conditions(
            status.conditions,
            [
                condition("WorldReachable", False, reason, str(exc)),
                *_rollout(None, None, reason, f"the World cannot be reached: {exc}"),
            ],
        ) + [c for c in status.conditions if c.type in ("SpecAccepted", "WorkersHealthy")]
        await _record(state, body, status, status.model_copy(update={"conditions": conditions}))
        metrics.world_reachable(namespace, name, False)
        log.warning("WorkflowDeployment %s/%s: %s", namespace, name, exc)
        return

    metrics.world_reachable(namespace, name, True)
    seen = await workers.Workers.read(state.kube, namespace, name)  # two LISTs per tick
    observed = {
        r.id: await _observe(state, namespace, world, r, seen)
        for r in status.revisions
        if r.phase != "Retired"
    }
    metrics.world_load(namespace, name, sum(o.active_runs for o in observed.values()))
    plan = revisions.plan(
        namespace=namespace,
        name=name,
        uid=uid,
        generation=meta.get("generation"),
        spec=spec,
        status=status,
        observed=observed,
        now=kube.now(),
    )
    by_id = {r.id: r for r in plan.status.revisions}
    hashes: dict[str, str] = {}
    for revision_id in plan.keep:
        revision = by_id[revision_id]
        rendered: list[str] = []
        for role in manifests.ROLES:
            draining = not pinned.rolls(revision)
            if draining:  # its own pod template (see below), fewer replicas (spec.draining)
                replicas = await pinned.draining_replicas(world, spec, revision_id, role)
            elif role == "orchestrator":
                replicas = spec.orchestrator.replicas
            elif spec.steps.autoscale is not None and not workers.replicas_external(spec, role):
                replicas = await steps_replicas(world, spec, revision_id)
            else:
                replicas = spec.steps.replicas
            manifest = manifests.worker_deployment(
                owner=name,
                owner_uid=uid,
                namespace=namespace,
                revision=revision_id,
                image=revision.image,
                module=revision.module,
                spec=spec,
                role=role,
                replicas=replicas,
                transport_keys=state.worlds.transport_keys(namespace, spec.world),
                secret_checksum=state.worlds.secret_checksum(namespace, spec.world),
            )
            current = seen.current(manifest["metadata"]["name"])
            external = workers.replicas_external(spec, role)
            if draining and await state.kube.scale_deployment(
                manifest, pinned.followed(manifest), current=current, keep_replicas=external
            ):
                continue  # scaled; only the operator's own pod annotations followed
            rendered.append(manifest["spec"]["template"]["metadata"]["annotations"][HASH])
            try:
                await state.kube.ensure_deployment(
                    manifest, current=current, keep_replicas=external
                )
            except DeploymentRefused as exc:  # a template field the API server refuses
                await _refuse(state, body, status, str(exc), reason="InvalidTemplate")
                return
        if len(rendered) == len(manifests.ROLES):
            hashes[revision_id] = pinned.role_hashes(rendered)
        state.owners[revision_id] = Owner(
            namespace,
            name,
            spec.mirror_runs,
            _mirror_ttl(spec.mirror_runs_ttl_seconds_after_finished),
        )
    own = frozenset(r.id for r in plan.status.revisions)
    await rollout.promote(world, plan.status.latest_revision, own)
    plan = await rollout.retire(state, namespace, world, plan, active_runs)
    acted = await pinned.act(world, spec, plan.status, namespace=namespace, name=name)

    latest = plan.status.latest_revision
    newest = next((r for r in reversed(plan.status.revisions) if r.phase != "Retired"), None)
    troubles = [f"revision {r.id}: {r.message}" for r in plan.status.revisions if r.message]
    stalled = observed.get(newest.id) if newest is not None else None
    new_conditions = [
        condition("SpecAccepted", True, "Accepted"),
        condition("WorldReachable", True, "Connected"),
        *_rollout(
            latest,
            newest.id if newest is not None and newest.ready else None,
            stalled.stalled if stalled is not None else "",
            f"revision {newest.id}: {stalled.message}" if stalled and newest else "",
            coming=newest.id if newest is not None else None,
        ),
        condition(
            "WorkersHealthy",
            not troubles,
            "WorkersRunning" if not troubles else "WorkersFailing",
            "; ".join(troubles),
        ),
    ]
    final = pinned.with_hashes(plan.status, hashes).model_copy(
        update={"conditions": merge_conditions(status.conditions, new_conditions)}
    )
    await _record(state, body, status, final)
    for change in plan.changes:
        await state.kube.event(body, "Revision", change)
    for text, warning in acted:
        await state.kube.event(body, "RevisionAction", text, warning=warning)


def _mirror_ttl(seconds: int | None) -> int:
    return MIRROR_TTL_SECONDS if seconds is None else seconds


def _rollout(
    latest: str | None,
    ready_created: str | None,
    stall: str,
    stall_message: str,
    *,
    coming: str | None = None,
) -> list[models.Condition]:
    """``Ready``, ``Progressing``, ``Reconciling`` and ``Stalled`` (kstatus conventions).

    Ready only when the revision of the current spec (``ready_created``) is the one
    taking new runs (``latest``); Stalled, with the reason, when it cannot get there;
    Progressing (and kstatus's Reconciling) while it is coming up.
    """
    if ready_created is not None and ready_created == latest:
        ready = condition("Ready", True, "RevisionReady", f"revision {latest} takes new runs")
        moving = ("RolledOut", f"revision {latest} is rolled out", False)
    elif stall:
        serving = f"; revision {latest} still takes new runs" if latest else ""
        ready = condition("Ready", False, stall, stall_message + serving)
        moving = (stall, stall_message, False)
    else:
        waiting = f"waiting for revision {coming or '?'} to become ready"
        serving = f"; revision {latest} takes new runs meanwhile" if latest else ""
        ready = condition("Ready", False, "RevisionNotReady", waiting + serving)
        moving = ("RevisionProgressing", waiting, True)
    reason, text, ongoing = moving
    return [
        ready,
        condition("Progressing", ongoing, reason, text),
        condition("Reconciling", ongoing, reason, text),
        condition("Stalled", bool(stall), stall or "NotStalled", stall_message if stall else ""),
    ]


async def _refuse(
    state: State,
    body: dict[str, Any],
    status: WorkflowDeploymentStatus,
    problem: str,
    reason: str = "ReservedEnv",
) -> None:
    """A spec the operator will not apply: say so once, change nothing else (review M5)."""
    meta = body["metadata"]
    before = next((c for c in status.conditions if c.type == "SpecAccepted"), None)
    refusal = condition("SpecAccepted", False, reason, problem)
    rollout = _rollout(None, None, reason, problem)
    kept = {"SpecAccepted", *(c.type for c in rollout)}
    conditions = merge_conditions(status.conditions, [refusal, *rollout]) + [
        c for c in status.conditions if c.type not in kept
    ]
    await _record(state, body, status, status.model_copy(update={"conditions": conditions}))
    if before is None or before.status != "False" or before.message != problem:
        log.warning(
            "WorkflowDeployment %s/%s refused: %s", meta["namespace"], meta["name"], problem
        )
        await state.kube.event(body, "SpecRefused", problem, warning=True)


async def _record(
    state: State,
    body: dict[str, Any],
    before: WorkflowDeploymentStatus,
    after: WorkflowDeploymentStatus,
) -> None:
    meta = body["metadata"]
    generation = meta.get("generation")
    # Every status written is of this generation, with each condition saying so (kstatus).
    after = after.model_copy(
        update={
            "observed_generation": generation,
            "conditions": [
                c.model_copy(update={"observed_generation": generation}) for c in after.conditions
            ],
        }
    )
    if after == before:
        return
    await state.kube.patch_status(
        "workflowdeployments", meta["namespace"], meta["name"], models.dump(after)
    )


async def retire_all(state: State, body: dict[str, Any]) -> None:
    """Retire every revision of a deleted WorkflowDeployment in its World (best effort).

    So ``start_on_latest`` never picks a revision whose workers are gone. A World
    that cannot be reached does not hold the deletion up: it is logged.
    """
    meta = body["metadata"]
    spec = WorkflowDeploymentSpec.model_validate(body.get("spec") or {})
    status = models.parse_status(WorkflowDeploymentStatus, body.get("status"))
    pinned.forget(meta["namespace"], meta["name"])
    try:
        world = await state.worlds.get(meta["namespace"], spec.world)
        for revision in status.revisions:
            if revision.phase != "Retired":
                await world.deployments.retire(revision.id)
            state.owners.pop(revision.id, None)
    except Exception as exc:  # deletion must not wait on the World
        log.warning(
            "WorkflowDeployment %s/%s deleted; its revisions stay registered: %s",
            meta["namespace"],
            meta["name"],
            exc,
        )
