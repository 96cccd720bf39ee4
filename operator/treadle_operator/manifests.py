"""The worker Deployments of one revision, as plain manifests.

Each revision runs ``treadle worker MODULE --role orchestrator`` and ``--role
steps`` in two apps/v1 Deployments, with the revision's deployment id in
``TREADLE_DEPLOYMENT_ID`` (so they consume only that revision's subjects) and
the World's URLs from the Secret the WorkflowDeployment names, with its
optional transport keys (credentials, TLS files; ``transport``). The URLs are
files of a read-only Secret volume (``TREADLE_DATABASE_URL_FILE``,
``TREADLE_NATS_URL_FILE``), never environment variables, and the pod template
carries ``CHECKSUM_ANNOTATION``, the digest of the Secret keys the workers
read, so a rotated Secret rolls both Deployments (review R9). Both are owned
by the WorkflowDeployment, so deleting it removes them; the ownerReference
blocks the owner's foreground deletion, which under
``OwnerReferencesPermissionEnforcement`` needs ``update`` on
``workflowdeployments/finalizers`` (``permissions``, review R10). Pods run restricted
(``podsecurity``: non-root, read-only root with an emptyDir at /tmp, no
privilege escalation, no capabilities, RuntimeDefault seccomp).
"""

from __future__ import annotations

from typing import Any, Literal

from treadle_operator import models, podsecurity, podtemplate, transport
from treadle_operator.models import WorkflowDeploymentSpec

Role = Literal["orchestrator", "steps"]
ROLES: tuple[Role, ...] = ("orchestrator", "steps")

LABEL_DEPLOYMENT = "treadle.dev/deployment"
LABEL_REVISION = "treadle.dev/revision"
LABEL_ROLE = "treadle.dev/role"
MANAGED_BY = {"app.kubernetes.io/managed-by": "treadle-operator"}
CHECKSUM_ANNOTATION = "treadle.dev/world-secret-checksum"
WORKER_METRICS_PORT = 9464  # the worker's /metrics (treadle.metrics.server)
# The World URLs' files in the Secret volume (``transport.MOUNT_PATH``).
DATABASE_URL_FILE = "database-url"
NATS_URL_FILE = "nats-url"
MOUNT = transport.MOUNT_PATH


def deployment_name(revision: str, role: Role) -> str:
    return f"{revision}-{role}"


def labels(owner: str, revision: str, role: Role) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "treadle-worker",
        **MANAGED_BY,
        LABEL_DEPLOYMENT: owner,
        LABEL_REVISION: revision,
        LABEL_ROLE: role,
    }


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": models.API_VERSION,
        "kind": "WorkflowDeployment",
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def worker_env(
    spec: WorkflowDeploymentSpec, revision: str, transport_keys: frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    """The operator's variables, then ``spec.env`` (checked by ``podsecurity.reserved_env``)."""
    return [*operator_env(spec, revision, transport_keys), *(spec.env or [])]


def operator_env(
    spec: WorkflowDeploymentSpec, revision: str, transport_keys: frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    """What the operator sets for every worker; ``spec.env`` may not set these names
    (``transport_keys``: the World Secret's optional transport keys it passes on)."""
    secret = spec.world.secret_name
    return [
        {"name": "TREADLE_WORLD", "value": "postgres"},
        {"name": "TREADLE_DEPLOYMENT_ID", "value": revision},
        # /metrics on this port (the chart's PodMonitor scrapes the port named `metrics`);
        # an env var, not an argument, so an older revision's image just ignores it.
        {"name": "TREADLE_WORKER_METRICS_PORT", "value": str(WORKER_METRICS_PORT)},
        # The worker's identity is its pod's name (downward API): a container restarted in
        # its pod (kill -9, OOM) releases what it held at once (docs/recovery.md).
        {
            "name": "TREADLE_WORKER_ID",
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
        },
        {"name": "TREADLE_DATABASE_URL_FILE", "value": f"{MOUNT}/{DATABASE_URL_FILE}"},
        {"name": "TREADLE_NATS_URL_FILE", "value": f"{MOUNT}/{NATS_URL_FILE}"},
        {  # payload encryption at rest, when the World Secret carries keys
            "name": "TREADLE_PAYLOAD_KEY",
            "valueFrom": {
                "secretKeyRef": {
                    "name": secret,
                    "key": spec.world.payload_key_key,
                    "optional": True,
                }
            },
        },
        *transport.worker_env(secret, transport_keys),
    ]


def world_volume(
    spec: WorkflowDeploymentSpec, transport_keys: frozenset[str] = frozenset()
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The World Secret's volume (the URLs, and the transport keys that are files) and its
    read-only mount at ``transport.MOUNT_PATH``."""
    secret = spec.world.secret_name
    items = [
        {"key": spec.world.database_url_key, "path": DATABASE_URL_FILE},
        {"key": spec.world.nats_url_key, "path": NATS_URL_FILE},
    ]
    files = transport.worker_volume(secret, transport_keys)
    if files is not None:
        items += files[0]["secret"]["items"]
    volume = {
        "name": transport.VOLUME,
        "secret": {"secretName": secret, "defaultMode": transport.FILE_MODE, "items": items},
    }
    mount = {"name": transport.VOLUME, "mountPath": transport.MOUNT_PATH, "readOnly": True}
    return volume, mount


METRICS_PORT = {"name": "metrics", "containerPort": WORKER_METRICS_PORT, "protocol": "TCP"}


def _host_network(spec: WorkflowDeploymentSpec) -> bool:
    """A template that puts the workers on the node's network: a declared container port
    is then a host port, and the scheduler would place one worker a node (the
    orchestrator and steps of one revision could not share a node). Such workers declare
    none; each still serves /metrics on the port, the first of a node to bind it."""
    template = spec.template
    return bool(template is not None and (template.spec or {}).get("hostNetwork"))


def worker_deployment(
    *,
    owner: str,
    owner_uid: str,
    namespace: str,
    revision: str,
    image: str,
    module: str,
    spec: WorkflowDeploymentSpec,
    role: Role,
    replicas: int,
    transport_keys: frozenset[str] = frozenset(),
    secret_checksum: str | None = None,
) -> dict[str, Any]:
    """One role's Deployment for ``revision`` (image and module are the revision's own);
    ``transport_keys`` are the World Secret's transport keys (``transport.present``),
    ``secret_checksum`` the digest of the keys the workers read (``CHECKSUM_ANNOTATION``)."""
    tier = spec.orchestrator if role == "orchestrator" else spec.steps
    container: dict[str, Any] = {
        "name": "worker",
        "image": image,
        "command": ["treadle"],
        "args": [
            "worker",
            module,
            "--role",
            role,
            "--concurrency",
            str(tier.concurrency),
        ],
        "env": worker_env(spec, revision, transport_keys),
        "ports": [] if _host_network(spec) else [METRICS_PORT],
        # A worker that exits at start (a module it cannot import, say) writes why on
        # stderr only; a kubelet makes the log's tail the termination message, which the
        # WorkersHealthy / Stalled conditions quote (kube.pods_trouble). Without it a real
        # kubelet says "exit code 1" and nothing more.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": podsecurity.container_security(spec),
        "volumeMounts": [{"name": podsecurity.TMP_VOLUME, "mountPath": podsecurity.TMP_PATH}],
    }
    if spec.image_pull_policy is not None:
        container["imagePullPolicy"] = spec.image_pull_policy
    if tier.resources:
        container["resources"] = tier.resources
    pod_labels = labels(owner, revision, role)
    pod_spec: dict[str, Any] = {
        "containers": [container],
        # `treadle worker` finishes running deliveries on SIGTERM within --grace (30 s).
        "terminationGracePeriodSeconds": 40,
        "securityContext": podsecurity.pod_security(spec),
        "volumes": [{"name": podsecurity.TMP_VOLUME, "emptyDir": {}}],
    }
    files = world_volume(spec, transport_keys)
    pod_spec["volumes"].append(files[0])
    container["volumeMounts"].append(files[1])
    if spec.service_account_name:
        pod_spec["serviceAccountName"] = spec.service_account_name
    else:
        pod_spec["automountServiceAccountToken"] = False
    pod_metadata: dict[str, Any] = {"labels": pod_labels}
    if secret_checksum is not None:
        pod_metadata["annotations"] = {CHECKSUM_ANNOTATION: secret_checksum}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(revision, role),
            "namespace": namespace,
            "labels": pod_labels,
            "ownerReferences": [owner_reference(owner, owner_uid)],
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {LABEL_REVISION: revision, LABEL_ROLE: role}},
            # spec.template merged under what the operator owns, with its hash (podtemplate)
            "template": podtemplate.merge(
                {"metadata": pod_metadata, "spec": pod_spec}, spec.template
            ),
        },
    }


def template_refusal(
    spec: WorkflowDeploymentSpec, transport_keys: frozenset[str] = frozenset()
) -> str | None:
    """Why ``spec.template`` cannot be merged under the owned pod template, or None."""
    if spec.template is None:
        return None
    bare = spec.model_copy(update={"template": None})
    owned = worker_deployment(
        owner="-", owner_uid="-", namespace="-", revision="-", image=spec.image,
        module=spec.module, spec=bare, role="steps", replicas=0, transport_keys=transport_keys,
    )["spec"]["template"]  # fmt: skip
    reserved = podsecurity.reserved_names(operator_env(spec, "-", transport_keys))
    return podtemplate.refusal(spec.template, owned, reserved)
