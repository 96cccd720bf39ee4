"""The Kubernetes API calls the operator makes itself (kopf makes the rest).

A thin, typed layer over ``kubernetes_asyncio``: secrets, the worker
Deployments, their Pods' troubles, the custom objects' status, and Events.
Every verb used here is listed in ``permissions.OPERATOR_RULES``; a 404 where
"already gone" is fine is not an error.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from treadle_operator import models
from treadle_operator.errors import DeploymentRefused, NotConfigured, WorldSecretForbidden
from treadle_operator.secretdata import SecretData

log = logging.getLogger("treadle.operator.kube")

# Container states that mean a worker cannot run, and are worth a condition.
# (the waiting reason -> the WorkflowDeployment's Stalled reason)
_TROUBLE = {
    "CrashLoopBackOff": "CrashLoop",
    "CreateContainerConfigError": "ContainerConfig",
    "CreateContainerError": "ContainerConfig",
    "ErrImagePull": "ImagePull",
    "ErrImageNeverPull": "ImagePull",  # imagePullPolicy Never, and the node lacks it
    "ImagePullBackOff": "ImagePull",
    "InvalidImageName": "ImagePull",
    "RunContainerError": "CrashLoop",
}

_UNSCHEDULABLE = ("PodScheduled", "False", "Unschedulable")


@dataclass(frozen=True)
class Trouble:
    """Why a revision's workers cannot run: a ``Stalled`` reason and one line."""

    reason: str
    message: str


READ = object()  # ``ensure_deployment``: read the Deployment first
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
# The client would send a dict as a JSON *patch*; ours are merge patches.
_MERGE: dict[str, Any] = {"_content_type": MERGE_PATCH}
_JSON: dict[str, Any] = {"_content_type": JSON_PATCH}


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def login() -> client.ApiClient:
    """An API client: in-cluster when in a Pod, else ``$KUBECONFIG`` / ``~/.kube/config``."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        try:
            await config.load_kube_config()
        except (config.ConfigException, OSError) as exc:
            raise NotConfigured(
                f"no Kubernetes cluster to talk to: not in a Pod, and the kubeconfig "
                f"($KUBECONFIG or ~/.kube/config) cannot be used: {exc}"
            ) from None
    return client.ApiClient()


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    async def close(self) -> None:
        await self.api.close()

    # -- secrets --------------------------------------------------------------------------

    async def secret(self, namespace: str, name: str) -> SecretData | None:
        """A Secret's data, each key decoded when read (``secretdata``); ``None`` when there
        is no such Secret."""
        try:
            found = await self.core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status == 403:
                raise WorldSecretForbidden(
                    f"the operator may not read Secret {namespace}/{name}: its RBAC allows only "
                    "the World Secret names of the chart's rbac.worldSecretNames, in the "
                    "namespaces it serves"
                ) from None
            raise
        version = found.metadata.resource_version if found.metadata is not None else None
        return SecretData(f"{namespace}/{name}", found.data or {}, version)

    # -- worker Deployments ----------------------------------------------------------------

    async def ensure_deployment(
        self, manifest: dict[str, Any], *, current: Any = READ, keep_replicas: bool = False
    ) -> str:
        """Bring the Deployment to the manifest's spec: read first (or take ``current``, a
        ``V1Deployment`` or ``None`` from a LIST of this tick), create it when missing,
        patch only on a real difference (review R5 (c): no create-409-read per tick).
        ``keep_replicas``: an external autoscaler owns them; never overwritten, set only
        at creation. Returns ``created``, ``patched`` or ``unchanged``."""
        meta = manifest["metadata"]
        if current is READ:
            current = await self.read_deployment(meta["namespace"], meta["name"])
        if current is None:
            try:
                await self.apps.create_namespaced_deployment(meta["namespace"], cast(Any, manifest))
                log.info("created Deployment %s/%s", meta["namespace"], meta["name"])
                return "created"
            except ApiException as exc:
                if exc.status != 409:
                    raise _refused(exc, meta) from None
                current = await self.read_deployment(meta["namespace"], meta["name"])
                if current is None:
                    raise
        wanted = dict(manifest["spec"])
        if keep_replicas:
            wanted.pop("replicas", None)
        replicas_differ = not keep_replicas and current.spec.replicas != wanted["replicas"]
        if not replicas_differ and not _template_differs(
            self.api.sanitize_for_serialization(current.spec.template), wanted["template"]
        ):
            return "unchanged"
        try:  # replicas and pod template as wholes: a key dropped from Git is dropped
            await self.apps.patch_namespaced_deployment(
                meta["name"], meta["namespace"], replace_ops(wanted), **_JSON
            )
        except ApiException as exc:
            raise _refused(exc, meta) from None
        return "patched"

    async def read_deployment(self, namespace: str, name: str) -> Any:
        """The Deployment (a ``V1Deployment``), ``None`` when there is none."""
        try:
            return await self.apps.read_namespaced_deployment(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def scale_deployment(
        self,
        manifest: dict[str, Any],
        follow: dict[str, str],
        *,
        current: Any = READ,
        keep_replicas: bool = False,
    ) -> bool:
        """Set only the manifest's replicas and the pod annotations in ``follow`` on the
        Deployment (its pod template otherwise stays); ``False`` when it is gone.
        ``current`` and ``keep_replicas`` as for ``ensure_deployment``."""
        meta = manifest["metadata"]
        if current is READ:
            current = await self.read_deployment(meta["namespace"], meta["name"])
        if current is None:
            return False
        replicas = manifest["spec"]["replicas"]
        annotations = dict(current.spec.template.metadata.annotations or {})
        patch: dict[str, Any] = {}
        if not keep_replicas and current.spec.replicas != replicas:
            patch["replicas"] = replicas
        if any(annotations.get(k) != v for k, v in follow.items()):
            patch["template"] = {"metadata": {"annotations": follow}}
        if patch:
            await self.apps.patch_namespaced_deployment(
                meta["name"], meta["namespace"], {"spec": patch}, **_MERGE
            )
        return True

    async def list_deployments(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The Deployments of ``namespace`` matching the label ``selector``, as plain dicts."""
        listed = await self.apps.list_namespaced_deployment(namespace, label_selector=selector)
        plain: list[dict[str, Any]] = self.api.sanitize_for_serialization(listed).get("items", [])
        return plain

    async def deployments_by_name(self, namespace: str, selector: str) -> dict[str, Any]:
        """The selected Deployments (``V1Deployment``) by name, in one LIST."""
        found = await self.apps.list_namespaced_deployment(namespace, label_selector=selector)
        return {d.metadata.name: d for d in found.items}

    async def list_pods(self, namespace: str, selector: str) -> list[Any]:
        """The selected Pods, in one LIST."""
        found = await self.core.list_namespaced_pod(namespace, label_selector=selector)
        return list(found.items)

    async def delete_deployment(self, namespace: str, name: str) -> None:
        try:
            await self.apps.delete_namespaced_deployment(
                name, namespace, propagation_policy="Background"
            )
            log.info("deleted Deployment %s/%s", namespace, name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def deployment_state(self, namespace: str, name: str) -> tuple[bool, Trouble | None]:
        """At least one replica ready (or none wanted); and why it cannot progress, if so.

        The Deployment controller's own conditions: ``Progressing`` False with
        ``ProgressDeadlineExceeded``, and ``ReplicaFailure`` (a ReplicaSet that
        cannot make pods: quota, admission), copied from its ReplicaSet.
        """
        return deployment_state_of(await self.read_deployment(namespace, name), name)

    async def pod_trouble(self, namespace: str, selector: str) -> Trouble | None:
        """Why the selected Pods cannot run or be scheduled, in one line (``None``: they can)."""
        return pods_trouble(await self.list_pods(namespace, selector))

    # -- custom objects ---------------------------------------------------------------------

    async def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self.custom.get_namespaced_custom_object(
                models.GROUP, models.VERSION, namespace, plural, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return found

    async def create(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        made: dict[str, Any] = await self.custom.create_namespaced_custom_object(
            models.GROUP, models.VERSION, namespace, plural, body
        )
        return made

    async def delete(self, plural: str, namespace: str, name: str) -> None:
        try:
            await self.custom.delete_namespaced_custom_object(
                models.GROUP, models.VERSION, namespace, plural, name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def patch_labels(
        self, plural: str, namespace: str, name: str, labels: dict[str, str | None]
    ) -> bool:
        """Merge ``labels`` into the object's (``None`` removes one); ``False`` when gone."""
        try:
            await self.custom.patch_namespaced_custom_object(
                models.GROUP,
                models.VERSION,
                namespace,
                plural,
                name,
                {"metadata": {"labels": labels}},
                **_MERGE,
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def patch_status(
        self,
        plural: str,
        namespace: str,
        name: str,
        status: dict[str, Any],
        *,
        resource_version: str | None = None,
    ) -> bool:
        """Merge ``status`` into the object's status; ``False`` when the object is gone.

        With ``resource_version``, only onto that version of the object (else 409).
        """
        patch: dict[str, Any] = {"status": status}
        if resource_version is not None:
            patch["metadata"] = {"resourceVersion": resource_version}
        try:
            await self.custom.patch_namespaced_custom_object_status(
                models.GROUP,
                models.VERSION,
                namespace,
                plural,
                name,
                patch,
                **_MERGE,
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # -- events -----------------------------------------------------------------------------

    async def event(
        self, obj: dict[str, Any], reason: str, message: str, *, warning: bool = False
    ) -> None:
        """A Kubernetes Event on ``obj`` (best effort: a failure is logged, never raised)."""
        meta = obj.get("metadata", {})
        stamp = now()
        body = {
            "metadata": {
                "generateName": f"{meta.get('name', 'treadle')}.",
                "namespace": meta.get("namespace"),
            },
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", models.API_VERSION),
                "kind": obj.get("kind"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "treadle-operator"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.core.create_namespaced_event(meta.get("namespace"), cast(Any, body))
        except ApiException as exc:
            log.warning("cannot post event %s on %s: %s", reason, meta.get("name"), exc.reason)


def _template_differs(current: Any, wanted: dict[str, Any]) -> bool:
    """Whether what we set in a pod template differs from what is there (defaults aside)."""
    cur_container = (current.get("spec", {}).get("containers") or [{}])[0]
    want_container = wanted["spec"]["containers"][0]
    # securityContext too: an operator upgrade hardens the workers it already runs.
    keys = ("image", "args", "command", "securityContext")
    # The operator's annotations (podtemplate's hash of the whole template): any change rolls.
    if _ours(current.get("metadata")) != _ours(wanted.get("metadata")):
        return True
    if (current.get("spec", {}).get("securityContext") or {}) != (
        wanted["spec"].get("securityContext") or {}
    ):
        return True
    return any(cur_container.get(key) != want_container.get(key) for key in keys)


def _ours(meta: Any) -> dict[str, Any]:
    annotations = (meta or {}).get("annotations") or {}
    return {k: v for k, v in annotations.items() if k.startswith("treadle.dev/")}


def replace_ops(wanted: dict[str, Any]) -> list[dict[str, Any]]:
    """A JSON patch replacing the Deployment's replicas and pod template as wholes (a merge
    patch would keep a key the template dropped: a nodeSelector entry, a label)."""
    return [
        {"op": "replace", "path": f"/spec/{key}", "value": wanted[key]}
        for key in ("replicas", "template")
        if key in wanted
    ]


def _refused(exc: ApiException, meta: dict[str, Any]) -> Exception:
    """A 400/422 on a worker Deployment as ``DeploymentRefused`` (one line); others as they are."""
    if exc.status not in (400, 422):
        return exc
    try:
        message = json.loads(exc.body or "{}").get("message") or exc.reason
    except (ValueError, AttributeError):
        message = exc.reason
    return DeploymentRefused(
        f"the API server refused Deployment {meta['namespace']}/{meta['name']}: {message}"
    )


def deployment_state_of(found: Any, name: str) -> tuple[bool, Trouble | None]:
    """``Kube.deployment_state`` of a ``V1Deployment`` already read (``None``: missing)."""
    if found is None:
        return False, None
    wanted = found.spec.replicas or 0
    ready = wanted == 0 or (found.status.ready_replicas or 0) >= 1
    trouble = None
    for cond in found.status.conditions or []:
        if cond.type == "ReplicaFailure" and cond.status == "True":
            trouble = Trouble("ReplicaFailure", f"Deployment {name}: {cond.message or ''}")
        elif (
            cond.type == "Progressing"
            and cond.status == "False"
            and cond.reason == "ProgressDeadlineExceeded"
        ):
            trouble = Trouble(
                "ProgressDeadlineExceeded", f"Deployment {name}: {cond.message or ''}"
            )
    return ready, trouble


def pods_trouble(pods: list[Any]) -> Trouble | None:
    """Why these Pods cannot run or be scheduled, in one line (``None``: they can)."""
    for pod in pods:
        for status in pod.status.container_statuses or []:
            waiting = status.state.waiting if status.state else None
            if waiting is None or waiting.reason not in _TROUBLE:
                continue
            detail = waiting.message or ""
            last = status.last_state.terminated if status.last_state else None
            if last is not None:
                detail = (last.message or "").strip() or f"exit code {last.exit_code}"
            tail = detail.strip().splitlines()[-1] if detail.strip() else ""
            line = f"pod {pod.metadata.name}: {waiting.reason}" + (f": {tail}" if tail else "")
            return Trouble(_TROUBLE[waiting.reason], line)
        for cond in pod.status.conditions or []:
            if (cond.type, cond.status, cond.reason) == _UNSCHEDULABLE:
                line = f"pod {pod.metadata.name}: Unschedulable: {cond.message or ''}"
                return Trouble("Unschedulable", line.strip().rstrip(":"))
    return None
