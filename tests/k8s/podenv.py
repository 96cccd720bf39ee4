"""A container's environment and argv, resolved from its Pod as a kubelet resolves them.

``container_env`` applies ``envFrom`` (Secret/ConfigMap, with prefix and
``optional``), then ``env`` (``value`` with ``$(VAR)`` expansion, and
``valueFrom`` secretKeyRef / configMapKeyRef / fieldRef). A missing Secret,
ConfigMap or key raises ``ContainerError`` with the kubelet's reason
``CreateContainerConfigError``; the process kubelet (``kubelet.py``) reports
it as the container's waiting state and tries again. ``container_argv`` turns
``command`` + ``args`` into a local argv: ``treadle`` and ``python`` run with
this interpreter.
"""

from __future__ import annotations

import base64
import re
import shutil
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

# Reads a "secrets" or "configmaps" object in a namespace; None when it does not exist.
Lookup = Callable[[str, str, str], Awaitable[dict[str, Any] | None]]

POD_IP = "127.0.0.1"
CONFIG_ERROR = "CreateContainerConfigError"
CREATE_ERROR = "CreateContainerError"
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_INDEXED_FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")
_KINDS = {"secretRef": "secrets", "configMapRef": "configmaps"}
_KEY_KINDS = {"secretKeyRef": "secrets", "configMapKeyRef": "configmaps"}
_KIND_NAMES = {"secrets": "Secret", "configmaps": "ConfigMap"}


class ContainerError(Exception):
    """The container cannot be created; ``reason`` is the kubelet's waiting reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def expand(text: str, env: Mapping[str, str]) -> str:
    """``$(NAME)`` becomes NAME's value when defined (else stays), ``$$`` becomes ``$``."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return env.get(name, match.group(0))

    return _REFERENCE.sub(replace, text)


def _decoded(kind: str, obj: dict[str, Any]) -> dict[str, str]:
    # A binary key (a keystore) must not fail the others: a kubelet passes bytes through.
    if kind == "secrets":
        return {
            k: base64.b64decode(v).decode(errors="replace")
            for k, v in (obj.get("data") or {}).items()
        }
    binary = {
        k: base64.b64decode(v).decode(errors="replace")
        for k, v in (obj.get("binaryData") or {}).items()
    }
    return {**binary, **(obj.get("data") or {})}


async def _source(kind: str, namespace: str, name: str, lookup: Lookup) -> dict[str, str] | None:
    obj = await lookup(kind, namespace, name)
    return None if obj is None else _decoded(kind, obj)


def _missing(kind: str, namespace: str, name: str) -> ContainerError:
    return ContainerError(CONFIG_ERROR, f'{kind[:-1]} "{name}" not found in namespace {namespace}')


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """The downward-API value of ``fieldRef.fieldPath`` for ``pod``."""
    meta, spec = pod["metadata"], pod["spec"]
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": POD_IP,
        "status.hostIP": POD_IP,
    }
    if path in simple:
        return str(simple[path])
    indexed = _INDEXED_FIELD.match(path)
    if indexed:
        return str((meta.get(indexed.group(1)) or {}).get(indexed.group(2), ""))
    raise ContainerError(CONFIG_ERROR, f"fieldRef {path!r} is not supported by the process kubelet")


async def _value_from(
    pod: Mapping[str, Any], name: str, source: Mapping[str, Any], lookup: Lookup
) -> str | None:
    if "fieldRef" in source:
        return field_value(pod, source["fieldRef"]["fieldPath"])
    for field, kind in _KEY_KINDS.items():
        if field in source:
            ref = source[field]
            namespace = pod["metadata"]["namespace"]
            data = await _source(kind, namespace, ref["name"], lookup)
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    return None
                if data is None:
                    raise _missing(kind, namespace, ref["name"])
                where = f"{_KIND_NAMES[kind]} {namespace}/{ref['name']}"
                raise ContainerError(CONFIG_ERROR, f"couldn't find key {ref['key']} in {where}")
            return data[ref["key"]]
    raise ContainerError(CONFIG_ERROR, f"env {name}: valueFrom {sorted(source)} is not supported")


async def container_env(
    pod: Mapping[str, Any], container: Mapping[str, Any], lookup: Lookup
) -> dict[str, str]:
    """The variables ``envFrom`` and ``env`` define for ``container``, in a kubelet's order."""
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        for field, kind in _KINDS.items():
            if field not in source:
                continue
            ref = source[field]
            data = await _source(kind, namespace, ref["name"], lookup)
            if data is None:
                if ref.get("optional"):
                    continue
                raise _missing(kind, namespace, ref["name"])
            env.update({source.get("prefix", "") + k: v for k, v in data.items()})
    for var in container.get("env") or []:
        if "valueFrom" in var:
            value = await _value_from(pod, var["name"], var["valueFrom"], lookup)
            if value is not None:
                env[var["name"]] = value
        else:
            env[var["name"]] = expand(var.get("value", ""), env)
    return env


def container_argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """``command`` + ``args`` with ``$(VAR)`` expanded; ``treadle``/``python`` use this Python."""
    command = [expand(part, env) for part in container.get("command") or []]
    args = [expand(part, env) for part in container.get("args") or []]
    if not command:
        raise ContainerError(
            CREATE_ERROR, "no command: the process kubelet cannot run an image's entrypoint"
        )
    program, rest = command[0], command[1:]
    if program == "treadle":
        return [sys.executable, "-m", "treadle.cli", *rest, *args]
    if program in ("python", "python3"):
        return [sys.executable, *rest, *args]
    found = shutil.which(program, path=env.get("PATH"))
    if found is None:
        raise ContainerError(CREATE_ERROR, f'executable "{program}" not found in $PATH')
    return [found, *rest, *args]
