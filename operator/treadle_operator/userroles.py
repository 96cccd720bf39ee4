"""The roles of the people who use the CRDs (not the operator's): view and edit.

The chart renders them as two ClusterRoles (``charts/treadle/templates/
user-roles.yaml``, value ``rbac.userRoles``) labelled to aggregate into
Kubernetes' built-in roles, as Argo Workflows and most operators ship them:

- ``VIEW_RULES`` (label ``rbac.authorization.k8s.io/aggregate-to-view``): get,
  list, watch WorkflowDeployments and WorkflowRuns and their status. The
  built-in ``view`` role is itself aggregated into ``edit`` and ``admin``.
- ``EDIT_RULES`` (``aggregate-to-edit``, so also ``admin``): the same plus
  create, update, patch, delete and deletecollection; never ``/status``, which
  the operator alone writes.

So a RoleBinding to ``edit`` in a namespace lets a team apply WorkflowRuns
there, and ``view`` lets it read them, with no treadle-specific binding. A kind
added to the CRDs is added to ``CRD_RESOURCES`` (and the template) here.
``tests/chart`` fails when the template's rules differ from these.
"""

from __future__ import annotations

from typing import Final

from treadle_operator.permissions import PolicyRule

GROUP: Final = "treadle.dev"
CRD_RESOURCES: tuple[str, ...] = (
    "workflowdeployments",
    "workflowruns",
    "workflowsignals",
    "workflowschedules",
)
READ: tuple[str, ...] = ("get", "list", "watch")
WRITE: tuple[str, ...] = ("create", "update", "patch", "delete", "deletecollection")
VIEW_LABEL: Final = "rbac.authorization.k8s.io/aggregate-to-view"
EDIT_LABEL: Final = "rbac.authorization.k8s.io/aggregate-to-edit"

VIEW_RULES: tuple[PolicyRule, ...] = (
    PolicyRule(
        api_groups=(GROUP,),
        resources=(*CRD_RESOURCES, *(f"{r}/status" for r in CRD_RESOURCES)),
        verbs=READ,
    ),
)
EDIT_RULES: tuple[PolicyRule, ...] = (
    PolicyRule(api_groups=(GROUP,), resources=CRD_RESOURCES, verbs=(*READ, *WRITE)),
)
