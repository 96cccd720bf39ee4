"""The Kubernetes permissions the operator needs, and nothing more.

``OPERATOR_RULES`` is the one list of RBAC rules for the operator's service account.
The Helm chart's ClusterRole (``charts/treadle/templates/clusterrole.yaml``) spells out
the same rules, and ``tests/chart`` fails when the two differ, so a rule is added or
dropped here first. Why each rule is there:

- ``treadle.dev`` ``workflowdeployments``, ``workflowruns``: get, list, watch to
  reconcile them; patch for finalizers and annotations; create for runs started
  from code and mirrored as WorkflowRun objects (``mirrorRuns``); delete for a
  finished run's object after ``ttlSecondsAfterFinished``.
- ``treadle.dev`` ``workflowdeployments/status``, ``workflowruns/status``: get,
  patch to publish revisions and run phases.
- ``apps`` ``deployments``: one orchestrator and one step-worker Deployment per
  revision, created, scaled (patch) and removed once the revision is drained.
- ``""`` ``pods``: get, list, watch to turn crash-looping workers into conditions.
- ``""`` ``secrets``: get, the World's connection URLs a WorkflowDeployment names.
- ``""`` ``events``: create, patch, Kubernetes Events for phase changes (kopf posts
  its own too).
- ``apiextensions.k8s.io`` ``customresourcedefinitions`` and ``""`` ``namespaces``:
  list, watch, so kopf can discover its resources and serve every namespace.

The operator runs kopf ``--standalone`` (no peering objects), so it needs nothing
in ``kopf.dev``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PolicyRule:
    """One RBAC rule: these verbs on these resources of these API groups."""

    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]

    def as_manifest(self) -> dict[str, list[str]]:
        """The rule as it appears in a ClusterRole's ``rules`` list."""
        return {
            "apiGroups": list(self.api_groups),
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }


OPERATOR_RULES: tuple[PolicyRule, ...] = (
    PolicyRule(
        api_groups=("treadle.dev",),
        resources=("workflowdeployments", "workflowruns"),
        verbs=("get", "list", "watch", "patch", "create", "delete"),
    ),
    PolicyRule(
        api_groups=("treadle.dev",),
        resources=("workflowdeployments/status", "workflowruns/status"),
        verbs=("get", "patch"),
    ),
    PolicyRule(
        api_groups=("apps",),
        resources=("deployments",),
        verbs=("get", "list", "watch", "create", "patch", "delete"),
    ),
    PolicyRule(api_groups=("",), resources=("pods",), verbs=("get", "list", "watch")),
    PolicyRule(api_groups=("",), resources=("secrets",), verbs=("get",)),
    PolicyRule(api_groups=("",), resources=("events",), verbs=("create", "patch")),
    PolicyRule(
        api_groups=("apiextensions.k8s.io",),
        resources=("customresourcedefinitions",),
        verbs=("list", "watch"),
    ),
    PolicyRule(api_groups=("",), resources=("namespaces",), verbs=("list", "watch")),
)
