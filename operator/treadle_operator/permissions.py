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
- ``treadle.dev`` ``workflowdeployments/finalizers``: update. No object is changed
  through it: it is what ``OwnerReferencesPermissionEnforcement`` (OpenShift, and
  clusters that enable the admission plugin) asks of whoever creates an object whose
  ownerReference sets ``blockOwnerDeletion`` (the worker Deployments, owned by their
  WorkflowDeployment). Any kind the operator makes owners of needs the same.
- ``treadle.dev`` ``workflowsignals`` (+ ``/status``): get, list, watch to handle
  each signal once; patch for its status and kopf's annotations; delete after
  ``ttlSecondsAfterHandled``. A Rerun creates a WorkflowRun (``create`` above).
- ``""`` ``configmaps``: get (the rule below) is also what a ResumeHook's
  ``payloadFrom.configMapKeyRef`` reads (a ``secretKeyRef`` payload is refused).
- ``treadle.dev`` ``workflowschedules``: get, list, watch to put each as a World
  schedule; patch for kopf's finalizer (deleting one deletes its World schedule) and
  annotations (the mirrors of its runs are created, listed and pruned under the
  ``workflowruns`` rule); ``workflowschedules/status``: get, patch.
- ``apiextensions.k8s.io`` ``customresourcedefinitions`` and ``""`` ``namespaces``:
  list, watch, so kopf can discover its resources and serve every namespace
  (cluster scope only).

- ``""`` ``configmaps``: get, to read a WorkflowRun's ``spec.inputFrom.configMapKeyRef``
  when its run starts (docs/operator-admission.md). ``secretKeyRef`` inputs need their
  Secret names in the secrets rule too (the chart's ``rbac.inputSecretNames``).
- The admission webhook (chart ``webhook.enabled``), two more objects, by name only
  (``webhook_cluster_rules``, ``webhook_namespace_rules``): get and patch on the one
  ValidatingWebhookConfiguration the chart makes (its ``caBundle``), and in the
  operator's own namespace create Secrets plus get and patch on the webhook's
  certificate Secret (RBAC cannot limit ``create`` by name: the Role is confined to
  the release namespace instead).

The operator runs kopf ``--standalone`` (no peering objects), so it needs nothing
in ``kopf.dev``.

``leader_rules``: a Role in the release's own namespace only
(``templates/leader-role.yaml``), for the leader-election Lease (``leader``):
``create`` (RBAC cannot limit a create by name) and ``get``/``update`` of the one
Lease the chart names (``resourceNames``).
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
        resources=("workflowdeployments/finalizers",),
        verbs=("update",),
    ),
    PolicyRule(api_groups=("",), resources=("configmaps",), verbs=("get",)),
    # WorkflowSignal (signals.py): handled once, status written, deleted after its TTL.
    PolicyRule(
        api_groups=("treadle.dev",),
        resources=("workflowsignals",),
        verbs=("get", "list", "watch", "patch", "delete"),
    ),
    PolicyRule(
        api_groups=("treadle.dev",),
        resources=("workflowsignals/status",),
        verbs=("get", "patch"),
    ),
    PolicyRule(
        api_groups=("treadle.dev",),
        resources=("workflowschedules",),
        verbs=("get", "list", "watch", "patch"),
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
    input_secrets: tuple[str, ...] = (),
) -> tuple[PolicyRule, ...]:
    """The Role in each watched namespace (``rbac.scope: namespace``)."""
    return (*NAMESPACED_RULES, secrets_rule((*world_secrets, *input_secrets)))


def cluster_rules(
    world_secrets: tuple[str, ...] = DEFAULT_WORLD_SECRETS,
    input_secrets: tuple[str, ...] = (),
) -> tuple[PolicyRule, ...]:
    """The ClusterRole (``rbac.scope: cluster``)."""
    return (*namespace_rules(world_secrets, input_secrets), *CLUSTER_ONLY_RULES)


def webhook_cluster_rules(configuration: str) -> tuple[PolicyRule, ...]:
    """The webhook's ClusterRole: its one ValidatingWebhookConfiguration's caBundle."""
    return (
        PolicyRule(
            api_groups=("admissionregistration.k8s.io",),
            resources=("validatingwebhookconfigurations",),
            verbs=("get", "patch"),
            resource_names=(configuration,),
        ),
    )


def webhook_namespace_rules(secret: str) -> tuple[PolicyRule, ...]:
    """The webhook's Role in the operator's namespace: its certificate Secret."""
    return (
        PolicyRule(api_groups=("",), resources=("secrets",), verbs=("create",)),
        PolicyRule(
            api_groups=("",),
            resources=("secrets",),
            verbs=("get", "patch"),
            resource_names=(secret,),
        ),
    )


OPERATOR_RULES: tuple[PolicyRule, ...] = cluster_rules()


def leader_rules(lease_name: str) -> tuple[PolicyRule, ...]:
    """The leader-election Role in the operator's own namespace (docs/operator-ha.md)."""
    return (
        PolicyRule(api_groups=("coordination.k8s.io",), resources=("leases",), verbs=("create",)),
        PolicyRule(
            api_groups=("coordination.k8s.io",),
            resources=("leases",),
            verbs=("get", "update"),
            resource_names=(lease_name,),
        ),
    )
