"""One WorkflowDeployment's worker Deployments and Pods, read once per reconcile.

A reconcile used to cost, per live revision and role, a Deployment GET (its
state), a create that failed with 409 and another GET (``ensure_deployment``),
and per revision a Pod LIST (review operator.md R5 (c)). ``Workers.read`` makes
two LISTs for the whole WorkflowDeployment (its Deployments and its Pods, by the
``treadle.dev/deployment`` label); the revisions' readiness and troubles are read
from them, and ``ensure_deployment`` compares with the listed Deployment, writing
only when it is missing or differs. An idle reconcile (nothing changed) then
makes no write at all (docs/operator-reconcile.md has the figures).

Health (review R13): an orchestrator Deployment that wants 0 replicas is never
ready, so a revision with ``orchestrator.replicas: 0`` never becomes latest (no
run would be served there); it reads ``Stalled`` with reason ``NoOrchestrator``.
Step workers may want 0 (scaled to zero by an autoscaler) and still be ready.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from treadle_operator import kube, manifests, revisions
from treadle_operator.kube import Kube, Trouble
from treadle_operator.models import RevisionStatus, WorkflowDeploymentSpec

NO_ORCHESTRATOR = "NoOrchestrator"


@dataclass(frozen=True)
class Workers:
    """What one LIST of Deployments and one of Pods showed for a WorkflowDeployment."""

    deployments: dict[str, Any] = field(default_factory=dict)  # name -> V1Deployment
    pods: dict[str, list[Any]] = field(default_factory=dict)  # revision -> its V1Pods

    @classmethod
    async def read(cls, client: Kube, namespace: str, owner: str) -> Workers:
        selector = f"{manifests.LABEL_DEPLOYMENT}={owner}"
        found = await client.deployments_by_name(namespace, selector)
        pods: dict[str, list[Any]] = {}
        for pod in await client.list_pods(namespace, selector):
            revision = (pod.metadata.labels or {}).get(manifests.LABEL_REVISION, "")
            pods.setdefault(revision, []).append(pod)
        return cls(found, pods)

    def current(self, name: str) -> Any:
        """The listed Deployment of that name (``None``: there is none)."""
        return self.deployments.get(name)

    def role_state(self, revision: str, role: manifests.Role) -> tuple[bool, Trouble | None]:
        name = manifests.deployment_name(revision, role)
        found = self.current(name)
        ready, trouble = kube.deployment_state_of(found, name)
        if role == "orchestrator" and found is not None and (found.spec.replicas or 0) == 0:
            message = (
                f"Deployment {name} wants 0 replicas (orchestrator.replicas is 0): no "
                "orchestrator would serve runs started here"
            )
            return False, trouble or Trouble(NO_ORCHESTRATOR, message)
        return ready, trouble

    def trouble(self, revision: str) -> Trouble | None:
        return kube.pods_trouble(self.pods.get(revision, []))


def observed(
    workers: Workers, revision: RevisionStatus, registered: bool, active_runs: int
) -> revisions.Observed:
    """What the operator sees of one revision (``registered``: its workers told the World
    what they serve)."""
    states = [workers.role_state(revision.id, role) for role in manifests.ROLES]
    ready = all(ok for ok, _ in states) and registered
    trouble = workers.trouble(revision.id) or next((t for _, t in states if t), None)
    return revisions.Observed(
        ready=ready and trouble is None,
        active_runs=active_runs,
        message=trouble.message if trouble else "",
        stalled=trouble.reason if trouble else "",
    )


def replicas_external(spec: WorkflowDeploymentSpec, role: manifests.Role) -> bool:
    """The steps Deployment's replicas belong to an external HPA/KEDA scaler."""
    return role == "steps" and spec.steps.replicas_managed_by == "External"
