"""``spec.template``: a PodTemplateSpec merged under what the operator owns (issue 11 item 4).

``manifests.worker_deployment`` builds the pod template the operator needs (the
*owned* template: the worker container's name, image, command, args, the
``TREADLE_*`` env, the restricted securityContext of ``podsecurity``, its /tmp
and transport volumes, the pod labels) and calls ``merge`` to lay it over the
WorkflowDeployment's ``spec.template``; ``refusal`` (called through
``manifests.template_refusal`` by ``deployments.reconcile`` before anything is
applied) says why a template cannot be merged. The rules
(docs/operator-templates.md):

- Everything the operator does not set passes through: imagePullSecrets,
  nodeSelector, tolerations, affinity, priorityClassName, hostNetwork, volumes,
  initContainers, sidecar containers, and on the container named ``worker``
  probes, ports, volumeMounts, env, envFrom, resources, lifecycle...
- The operator's values win, and a template that sets one is refused, naming
  the field: the worker's image (``spec.image``), command and args, the
  ``TREADLE_*`` env names, its labels (``treadle.dev/*``, the selector),
  annotations under ``treadle.dev/``, its volume names and mount paths.
- securityContext (pod and worker container): the template's is merged over
  the operator's (the restricted defaults, or ``spec.podSecurityContext`` /
  ``spec.containerSecurityContext``); it may tighten them, never weaken them
  (no root, no privilege or escalation, no added capability but
  NET_BIND_SERVICE, no Unconfined seccomp, no writable root): weakening is the
  explicit ``spec.*SecurityContext`` fields' business. Sidecars and init
  containers get the restricted container defaults under their own.
- The worker container is the first; ``spec.<role>.resources`` beats the
  template worker's resources, ``spec.imagePullPolicy`` its pull policy,
  ``spec.serviceAccountName`` the template's.

``merge`` stamps ``HASH_ANNOTATION``, a hash of the merged template, on the pod
template: ``kube.ensure_deployment`` replaces a Deployment's pod template when
it differs, so any change (env, resources, template) rolls the workers.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from treadle_operator import podsecurity
from treadle_operator.models import PodTemplate

WORKER = "worker"
RESERVED_PREFIX = "treadle.dev/"
HASH_ANNOTATION = "treadle.dev/template-hash"
OWNED_CONTAINER_KEYS = ("image", "command", "args")
ALLOWED_ADDED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
WHERE = "spec.template"


def merge(owned: dict[str, Any], template: PodTemplate | None) -> dict[str, Any]:
    """The pod template: ``template`` under ``owned``, stamped with ``HASH_ANNOTATION``.

    Total: a conflict ``refusal`` would name is resolved for the operator (its
    value stays), so a refused template can never weaken what runs.
    """
    owned = copy.deepcopy(owned)
    meta = template.metadata if template is not None else None
    user = copy.deepcopy(template.spec or {}) if template is not None else {}
    own_meta: dict[str, Any] = owned.get("metadata") or {}
    own_spec: dict[str, Any] = owned["spec"]
    labels = {**_unreserved((meta.labels if meta else None) or {}), **own_meta.get("labels", {})}
    annotations = {
        **_unreserved((meta.annotations if meta else None) or {}),
        **own_meta.get("annotations", {}),
    }
    annotations.pop(HASH_ANNOTATION, None)

    own_worker, *own_others = own_spec["containers"]
    user_containers = [c for c in _dicts(user.pop("containers", None))]
    user_worker = next((c for c in user_containers if c.get("name") == WORKER), {})
    sidecars = [_sidecar(c) for c in user_containers if c.get("name") != WORKER]
    init = [_sidecar(c) for c in _dicts(user.pop("initContainers", None))]
    own_paths = {m.get("mountPath") for m in own_worker.get("volumeMounts", [])}
    own_volumes = {v.get("name") for v in own_spec.get("volumes", [])}

    worker = {k: v for k, v in user_worker.items() if k not in OWNED_CONTAINER_KEYS}
    worker.update({k: v for k, v in own_worker.items() if k in ("name", *OWNED_CONTAINER_KEYS)})
    own_env = list(own_worker.get("env") or [])
    names = {e.get("name") for e in own_env}
    worker["env"] = own_env + [
        e for e in _dicts(user_worker.get("env")) if e.get("name") not in names
    ]
    worker["volumeMounts"] = [
        m for m in _dicts(user_worker.get("volumeMounts")) if m.get("mountPath") not in own_paths
    ] + list(own_worker.get("volumeMounts") or [])
    worker["securityContext"] = secure_merge(
        own_worker.get("securityContext") or {}, user_worker.get("securityContext")
    )
    for key, value in own_worker.items():
        if key not in worker or key in ("resources", "imagePullPolicy"):
            worker[key] = value  # the operator's (spec.<role>.resources, spec.imagePullPolicy)

    spec: dict[str, Any] = {
        k: v for k, v in user.items() if k not in ("volumes", "securityContext")
    }
    spec["containers"] = [worker, *own_others, *sidecars]
    if init:
        spec["initContainers"] = init
    spec["volumes"] = list(own_spec.get("volumes") or []) + [
        v for v in _dicts(user.get("volumes")) if v.get("name") not in own_volumes
    ]
    spec["securityContext"] = secure_merge(
        own_spec.get("securityContext") or {}, user.get("securityContext")
    )
    for key, value in own_spec.items():
        if key in ("containers", "volumes", "securityContext"):
            continue
        if key == "terminationGracePeriodSeconds" and key in user:
            continue  # the template's grace wins over the default
        if key == "automountServiceAccountToken" and (
            user.get("serviceAccountName") or key in user
        ):
            continue  # a ServiceAccount the template names decides its own token
        spec[key] = value

    merged: dict[str, Any] = {"metadata": {"labels": labels}, "spec": spec}
    if annotations:
        merged["metadata"]["annotations"] = annotations
    merged["metadata"].setdefault("annotations", {})[HASH_ANNOTATION] = template_hash(merged)
    return merged


def template_hash(template: Mapping[str, Any]) -> str:
    """16 hex of the pod template's canonical JSON (its own hash annotation left out)."""
    body = copy.deepcopy(dict(template))
    (body.get("metadata") or {}).get("annotations", {}).pop(HASH_ANNOTATION, None)
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def secure_merge(base: Mapping[str, Any], tighter: Any) -> dict[str, Any]:
    """``tighter`` merged over ``base``, key by key; capabilities.drop is the union."""
    merged = copy.deepcopy(dict(base))
    if not isinstance(tighter, Mapping):
        return merged
    for key, value in tighter.items():
        if key == "capabilities" and isinstance(value, Mapping):
            caps = dict(merged.get("capabilities") or {})
            drop = [*caps.get("drop", []), *[d for d in value.get("drop", []) or []]]
            caps.update({k: v for k, v in value.items() if k != "drop"})
            if drop:
                caps["drop"] = list(dict.fromkeys(drop))
            merged["capabilities"] = caps
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def refusal(
    template: PodTemplate | None, owned: dict[str, Any], reserved_env: Iterable[str]
) -> str | None:
    """Why ``template`` cannot be merged under ``owned`` (the first problem), or None."""
    if template is None:
        return None
    reserved = frozenset(reserved_env)
    own_meta = owned.get("metadata") or {}
    meta = template.metadata
    for kind, given in (
        ("labels", meta.labels if meta else None),
        ("annotations", meta.annotations if meta else None),
    ):
        for key in given or {}:
            if key.startswith(RESERVED_PREFIX) or key in (own_meta.get(kind) or {}):
                return f"{WHERE}.metadata.{kind}[{key}] is set by the operator; remove it"
    spec = template.spec or {}
    own_spec = owned["spec"]
    own_worker = own_spec["containers"][0]
    for field in ("containers", "initContainers", "volumes"):
        problem = _named_list(spec, field)
        if problem:
            return problem
    for index, container in enumerate(spec.get("containers") or []):
        where = f"{WHERE}.spec.containers[{index}]"
        if container["name"] == WORKER:
            problem = _worker_refusal(container, where, own_worker, reserved)
            if problem:
                return problem
    own_volumes = {v.get("name") for v in own_spec.get("volumes", [])}
    for index, volume in enumerate(spec.get("volumes") or []):
        if volume["name"] in own_volumes:
            return (
                f"{WHERE}.spec.volumes[{index}] is named {volume['name']}, a volume the "
                f"operator mounts ({', '.join(sorted(own_volumes))}); rename it"
            )
    problem = weakening(spec.get("securityContext"), f"{WHERE}.spec.securityContext", pod=True)
    if problem:
        return problem
    if spec.get("automountServiceAccountToken") is True and not (
        spec.get("serviceAccountName") or own_spec.get("serviceAccountName")
    ):
        return (
            f"{WHERE}.spec.automountServiceAccountToken is true without a serviceAccountName: "
            "name the ServiceAccount whose token the workers need"
        )
    return None


def _worker_refusal(
    container: dict[str, Any], where: str, own: dict[str, Any], reserved: frozenset[str]
) -> str | None:
    for key in OWNED_CONTAINER_KEYS:
        if key in container:
            owner = "spec.image" if key == "image" else "the operator (treadle worker MODULE)"
            return f"{where} (worker) sets {key}, which is {owner}'s; remove it"
    for index, entry in enumerate(container.get("env") or []):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            return f"{where}.env[{index}] has no name"
        if name in reserved:
            return f"{where}.env[{index}] sets {name}, which the operator sets; remove it"
    own_paths = {m.get("mountPath") for m in own.get("volumeMounts", [])}
    for index, mount in enumerate(container.get("volumeMounts") or []):
        if not isinstance(mount, dict):
            return f"{where}.volumeMounts[{index}] is not an object"
        if mount.get("mountPath") in own_paths:
            return (
                f"{where}.volumeMounts[{index}] mounts at {mount.get('mountPath')}, where the "
                f"operator mounts ({', '.join(sorted(str(p) for p in own_paths))})"
            )
    return weakening(container.get("securityContext"), f"{where}.securityContext", pod=False)


def weakening(context: Any, where: str, *, pod: bool) -> str | None:
    """Which value of a template's securityContext weakens the restricted defaults, or None."""
    if context is None:
        return None
    if not isinstance(context, dict):
        return f"{where} is not an object"
    hint = "spec.podSecurityContext" if pod else "spec.containerSecurityContext"
    bad: str | None = None
    if context.get("runAsNonRoot") is False:
        bad = "runAsNonRoot: false"
    elif context.get("runAsUser") == 0:
        bad = "runAsUser: 0"
    elif (context.get("seccompProfile") or {}).get("type") == "Unconfined":
        bad = "seccompProfile Unconfined"
    elif not pod:
        caps = context.get("capabilities") or {}
        added = set(caps.get("add") or []) - ALLOWED_ADDED_CAPABILITIES
        if context.get("privileged") is True:
            bad = "privileged: true"
        elif context.get("allowPrivilegeEscalation") is True:
            bad = "allowPrivilegeEscalation: true"
        elif context.get("readOnlyRootFilesystem") is False:
            bad = "readOnlyRootFilesystem: false"
        elif added:
            bad = f"capabilities.add {sorted(added)}"
        elif context.get("procMount") == "Unmasked":
            bad = "procMount: Unmasked"
    if bad is None:
        return None
    return (
        f"{where} sets {bad}, weaker than the workers' restricted defaults; a template may "
        f"only tighten them (to loosen them on purpose, set {hint})"
    )


def _named_list(spec: Mapping[str, Any], field: str) -> str | None:
    value = spec.get(field)
    if value is None:
        return None
    if not isinstance(value, list):
        return f"{WHERE}.spec.{field} is not a list"
    seen: set[str] = set()
    for index, item in enumerate(value):
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or not name:
            return f"{WHERE}.spec.{field}[{index}] has no name"
        if name in seen:
            return f"{WHERE}.spec.{field}[{index}]: a second entry named {name}"
        seen.add(name)
    return None


def _sidecar(container: dict[str, Any]) -> dict[str, Any]:
    """Another container: the restricted container defaults under its own securityContext."""
    made = dict(container)
    made["securityContext"] = {
        **copy.deepcopy(podsecurity.DEFAULT_CONTAINER_SECURITY),
        **(container.get("securityContext") or {}),
    }
    return made


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _unreserved(given: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in given.items() if not k.startswith(RESERVED_PREFIX)}
