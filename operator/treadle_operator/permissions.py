"""The Kubernetes permissions the operator needs, and nothing more.

``cluster_rules`` and ``namespace_rules`` are the one source of RBAC rules for the
operator's service account, for the chart's two ``rbac.scope`` modes:

- ``cluster``: one ClusterRole (``charts/treadle/templates/clusterrole.yaml``) bound
  cluster-wide; the operator serves every namespace. It can create, scale and delete
  Deployments and read Pods in every namespace: that is what it is. Secrets are
  limited by name (``resourceNames``: the chart's ``rbac.worldSecretNames``), so it
  can read the World Secrets WorkflowDeployments name and no other Secret, in any
  namespace.
- ``namespace``: a Role and RoleBinding in each watched namespace
  (``templates/roles.yaml``) and nothing cluster-wide; the operator is started with
  ``--namespace`` for each and kopf's cluster scanning off (it needs no CRD or
  Namespace list), so it cannot touch, or read a Secret of, any other namespace.

``tests/chart`` fails when a template's rules differ from these, so a rule is added
or dropped here first. Why each rule is there:

- ``treadle.dev`` ``workflowdeployments``, ``workflowruns``: get, list, watch to
  reconcile them; patch for finalizers and annotations; create for runs started
  from code and mirrored as WorkflowRun objects (``mirrorRuns``); delete for a
  finished run's object after ``ttlSecondsAfterFinished``.
- ``treadle.dev`` ``workflowdeployments/status``, ``workflowruns/status``: get,
  patch to publish revisions and run phases.
- ``apps`` ``deployments``: one orchestrator and one step-worker Deployment per
  revision, created, scaled (patch) and removed once the revision is drained.
- ``""`` ``pods``: get, list, watch to turn crash-looping workers into conditions.
- ``""`` ``secrets``: get, only by name: the World's connection URLs a
  WorkflowDeployment names (``spec.world.secretName`` must be one of the names).
- ``""`` ``events``: create, patch, Kubernetes Events for phase changes (kopf posts
  its own too).
- ``treadle.dev`` ``workflowschedules``: get, list, watch to time their firings (the
  WorkflowRuns they fire are created, listed, patched for ``spec.cancel`` and pruned
  under the ``workflowruns`` rule); ``workflowschedules/status``: get, patch.
- ``apiextensions.k8s.io`` ``customresourcedefinitions`` and ``""`` ``namespaces``:
  list, watch, so kopf can discover its resources and serve every namespace
  (cluster scope only).

The operator runs kopf ``--standalone`` (no peering objects), so it needs nothing
in ``kopf.dev``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PolicyRule:
    """One RBAC rule: these verbs on these resources (of these names) of these API groups."""

    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    resource_names: tuple[str, ...] = ()

    def as_manifest(self) -> dict[str, list[str]]:
        """The rule as it appears in a Role's or ClusterRole's ``rules`` list."""
        rule = {
            "apiGroups": list(self.api_groups),
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }
        if self.resource_names:
            rule["resourceNames"] = list(self.resource_names)
        return rule


DEFAULT_WORLD_SECRETS: tuple[str, ...] = ("treadle-world",)

NAMESPACED_RULES: tuple[PolicyRule, ...] = (
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
    PolicyRule(api_groups=("",), resources=("events",), verbs=("create", "patch")),
    PolicyRule(
        api_groups=("treadle.dev",),
        resources=("workflowschedules",),
        verbs=("get", "list", "watch"),
    ),
    PolicyRule(
        api_groups=("treadle.dev",),
        resources=("workflowschedules/status",),
        verbs=("get", "patch"),
    ),
)
CLUSTER_ONLY_RULES: tuple[PolicyRule, ...] = (
    PolicyRule(
        api_groups=("apiextensions.k8s.io",),
        resources=("customresourcedefinitions",),
        verbs=("list", "watch"),
    ),
    PolicyRule(api_groups=("",), resources=("namespaces",), verbs=("list", "watch")),
)


def secrets_rule(world_secrets: tuple[str, ...]) -> PolicyRule:
    """``get`` on the named Secrets only (RBAC cannot restrict ``get`` any finer)."""
    if not world_secrets:
        raise ValueError("name at least one World Secret the operator may read")
    return PolicyRule(
        api_groups=("",), resources=("secrets",), verbs=("get",), resource_names=world_secrets
    )


def namespace_rules(
    world_secrets: tuple[str, ...] = DEFAULT_WORLD_SECRETS,
) -> tuple[PolicyRule, ...]:
    """The Role in each watched namespace (``rbac.scope: namespace``)."""
    return (*NAMESPACED_RULES, secrets_rule(world_secrets))


def cluster_rules(world_secrets: tuple[str, ...] = DEFAULT_WORLD_SECRETS) -> tuple[PolicyRule, ...]:
    """The ClusterRole (``rbac.scope: cluster``)."""
    return (*namespace_rules(world_secrets), *CLUSTER_ONLY_RULES)


OPERATOR_RULES: tuple[PolicyRule, ...] = cluster_rules()
