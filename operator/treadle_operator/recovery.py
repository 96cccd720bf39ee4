"""Revisions found again from their worker Deployments when status was lost (review R11).

A WorkflowDeployment's revision list lives in its ``status``. A restore without
status, ``kubectl replace --subresource=status`` or a cluster migration loses it,
and with it the old revisions' Deployments would be orphaned (still owned, never
retired) and the numbering would start over. The Deployments carry
``treadle.dev/deployment`` and ``treadle.dev/revision`` labels and the revision's
image and module, and a revision id is a hash of its number
(``revisions.revision_id``), so ``rebuild`` lists them and recovers each revision
with its number; ``revisions.plan`` then goes on as usual: the one of the current
spec becomes latest when ready, the others drain and retire, and the next revision
gets the next number.

Called by ``deployments.reconcile`` only when status has no revisions (a new
object's first reconciles cost one Deployment list, nothing more).
"""

from __future__ import annotations

import logging
from typing import Any

from treadle_operator import manifests, revisions
from treadle_operator.models import RevisionStatus, WorkflowDeploymentStatus
from treadle_operator.state import State

log = logging.getLogger("treadle.operator.recovery")

MAX_NUMBER = 10_000  # revision numbers searched when recovering one from its id


def number_of(
    namespace: str, name: str, uid: str, revision: str, image: str, module: str
) -> int | None:
    """The revision number whose ``revision_id`` is ``revision``, if any up to MAX_NUMBER."""
    for number in range(1, MAX_NUMBER + 1):
        if revisions.revision_id(namespace, name, uid, number, image, module) == revision:
            return number
    return None


def from_deployments(
    namespace: str, name: str, uid: str, found: list[dict[str, Any]]
) -> tuple[list[RevisionStatus], int]:
    """The revisions the worker Deployments owned by ``uid`` show, oldest first, and the
    highest revision number among them (0 when none can be recovered)."""
    seen: dict[str, tuple[int, RevisionStatus]] = {}
    for deployment in found:
        meta = deployment.get("metadata") or {}
        owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
        revision = (meta.get("labels") or {}).get(manifests.LABEL_REVISION)
        if uid not in owners or not revision or revision in seen:
            continue
        containers = (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
            "containers"
        ) or []
        worker = next((c for c in containers if c.get("name") == "worker"), None)
        args = (worker or {}).get("args") or []
        if worker is None or len(args) < 2 or not worker.get("image"):
            continue
        image, module = str(worker["image"]), str(args[1])
        number = number_of(namespace, name, uid, revision, image, module) or 0
        created = str(meta.get("creationTimestamp") or "")
        seen[revision] = (
            number,
            RevisionStatus(
                id=revision,
                image=image,
                module=module,
                created_at=created,
                # Found again: it may carry runs; plan drains it unless it is the current one.
                phase="Draining",
                message="found again from its Deployments (status was lost)",
            ),
        )
    ordered = sorted(seen.values(), key=lambda item: (item[0], item[1].created_at))
    return [r for _, r in ordered], max((n for n, _ in ordered), default=0)


async def rebuild(
    state: State, namespace: str, name: str, uid: str, status: WorkflowDeploymentStatus
) -> WorkflowDeploymentStatus:
    """``status`` with its revisions found again, when it lists none."""
    if status.revisions:
        return status
    found = await state.kube.list_deployments(namespace, f"{manifests.LABEL_DEPLOYMENT}={name}")
    recovered, highest = from_deployments(namespace, name, uid, found)
    if not recovered:
        return status
    log.warning(
        "WorkflowDeployment %s/%s: status had no revisions; found %s again from their Deployments",
        namespace,
        name,
        ", ".join(r.id for r in recovered),
    )
    newest = recovered[-1]
    return status.model_copy(
        update={
            "revisions": recovered,
            "revision_count": max(status.revision_count, highest, len(recovered)),
            "latest_revision": status.latest_revision or newest.id,
        }
    )
