"""What a WorkflowDeployment may ask of its worker pods (security review M5).

Creating a WorkflowDeployment amounts to creating Deployments in its namespace
(any image, any ServiceAccount *of that namespace*, any Secret of that
namespace through ``spec.env``), as with Argo's workflows: grant it like that.
What the operator adds on top, and who may change it:

- ``DEFAULT_POD_SECURITY`` / ``DEFAULT_CONTAINER_SECURITY``: the restricted
  Pod Security Standard (non-root, read-only root filesystem with an emptyDir
  at ``/tmp``, no privilege escalation, every capability dropped,
  ``RuntimeDefault`` seccomp). Only ``spec.podSecurityContext`` and
  ``spec.containerSecurityContext`` replace them, each as a whole (no merge:
  what the pod runs with is what the object says). The image must run as a
  numeric non-root user (treadle's image is ``USER 10001``), or the object sets
  ``runAsUser``.
- ``reserved_env``: the ``TREADLE_*`` variables the operator sets (the World
  it picks, the revision's deployment id, the URLs from the Secret) and their
  ``*_FILE`` forms. A ``spec.env`` entry naming one is refused: the object gets
  ``SpecAccepted=False`` naming the entry, a Warning Event, and nothing of it
  is applied until it is fixed (a duplicate env name would otherwise win in
  Kubernetes, and ``TREADLE_DEPLOYMENT_ID`` would consume another revision's
  messages).
- ``automountServiceAccountToken`` is false unless ``spec.serviceAccountName``
  is set: workers never talk to the Kubernetes API, so the namespace's
  ``default`` token is not mounted. A named ServiceAccount is the object's
  choice (Kubernetes only lets a pod use one of its own namespace) and gets
  its token as that account says.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from treadle_operator.models import WorkflowDeploymentSpec

DEFAULT_POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    # The World Secret's files are mounted 0440 (transport.FILE_MODE), root's: a real
    # kubelet gives them this group, which every container's processes join, so the
    # image's user (10001 in docker/Dockerfile, or any other) can read them.
    "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}
DEFAULT_CONTAINER_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
TMP_VOLUME = "tmp"
TMP_PATH = "/tmp"


def pod_security(spec: WorkflowDeploymentSpec) -> dict[str, Any]:
    if spec.pod_security_context is not None:
        return dict(spec.pod_security_context)
    return _copy(DEFAULT_POD_SECURITY)


def container_security(spec: WorkflowDeploymentSpec) -> dict[str, Any]:
    if spec.container_security_context is not None:
        return dict(spec.container_security_context)
    return _copy(DEFAULT_CONTAINER_SECURITY)


def reserved_names(operator_env: Iterable[dict[str, Any]]) -> frozenset[str]:
    """The names the operator sets, and the ``NAME_FILE`` forms the runtime also reads
    (and for a ``NAME_FILE`` it sets, ``NAME``, which the runtime would read first)."""
    names = {str(entry["name"]) for entry in operator_env}
    bases = {name.removesuffix("_FILE") for name in names if name.endswith("_FILE")}
    return frozenset(names | bases | {f"{name}_FILE" for name in names})


def reserved_env(
    spec: WorkflowDeploymentSpec, operator_env: Iterable[dict[str, Any]]
) -> str | None:
    """Why ``spec.env`` cannot be applied (the first entry that sets a reserved name), or None."""
    reserved = reserved_names(operator_env)
    for index, entry in enumerate(spec.env or []):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            return f"spec.env[{index}] has no name"
        if name in reserved:
            return (
                f"spec.env[{index}] sets {name}, which the operator sets for every worker "
                f"(reserved: {', '.join(sorted(reserved))}); remove it"
            )
    return None


def _copy(value: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (_copy(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
        for k, v in value.items()
    }
