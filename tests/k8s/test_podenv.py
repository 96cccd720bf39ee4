"""How the process kubelet resolves a container's env and argv (no cluster needed).

Secrets and ConfigMaps come from a dict standing in for the API reads; the
cluster-backed behaviour is pinned in ``test_control_plane.py``. The process kubelet is
the fallback node of the operator scenarios (``pod_node.py``), so its tests stay.
"""

from __future__ import annotations

import base64
import sys
from typing import Any

import pytest

from . import podenv

POD = {
    "metadata": {"name": "p-1", "namespace": "ns", "uid": "u-1", "labels": {"app": "orders"}},
    "spec": {"nodeName": "treadle-node"},
}
OBJECTS: dict[tuple[str, str], dict[str, Any]] = {
    ("secrets", "db"): {"data": {"url": base64.b64encode(b"postgres://x").decode()}},
    ("configmaps", "cfg"): {"data": {"A": "1", "B": "2"}},
}


async def _lookup(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    assert namespace == "ns"
    return OBJECTS.get((kind, name))


async def test_env_from_then_env_with_expansion_and_downward_fields() -> None:
    """envFrom first (with prefix), then env; $(VAR) refers to earlier variables."""
    container = {
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "C_"}],
        "env": [
            {"name": "C_A", "value": "override"},
            {"name": "URL", "valueFrom": {"secretKeyRef": {"name": "db", "key": "url"}}},
            {"name": "WHO", "value": "$(APP)@$(URL) $$(URL) $(NOPE)"},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        ],
    }
    env = await podenv.container_env(POD, container, _lookup)
    assert env == {
        "C_A": "override",
        "C_B": "2",
        "URL": "postgres://x",
        "WHO": "$(APP)@postgres://x $(URL) $(NOPE)",
        "APP": "orders",
    }


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"secretKeyRef": {"name": "gone", "key": "k"}}, 'secret "gone" not found'),
        ({"secretKeyRef": {"name": "db", "key": "k"}}, "couldn't find key k in Secret ns/db"),
        ({"configMapKeyRef": {"name": "cfg", "key": "C"}}, "couldn't find key C in ConfigMap"),
    ],
)
async def test_missing_source_or_key_is_a_container_config_error(
    source: dict[str, Any], message: str
) -> None:
    container = {"env": [{"name": "X", "valueFrom": source}]}
    with pytest.raises(podenv.ContainerError) as refused:
        await podenv.container_env(POD, container, _lookup)
    assert refused.value.reason == "CreateContainerConfigError"
    assert message in refused.value.message


async def test_optional_missing_sources_are_skipped() -> None:
    optional_key = {"name": "gone", "key": "k", "optional": True}
    container = {
        "envFrom": [{"secretRef": {"name": "gone", "optional": True}}],
        "env": [{"name": "X", "valueFrom": {"secretKeyRef": optional_key}}],
    }
    assert await podenv.container_env(POD, container, _lookup) == {}


def test_treadle_and_python_commands_run_with_this_interpreter() -> None:
    env = {"PATH": "/usr/bin:/bin", "ROLE": "steps"}
    treadle = {"command": ["treadle", "worker"], "args": ["--role", "$(ROLE)"]}
    assert podenv.container_argv(treadle, env) == [
        sys.executable, "-m", "treadle.cli", "worker", "--role", "steps",
    ]  # fmt: skip
    assert podenv.container_argv({"command": ["python3", "-c", "1"]}, env)[0] == sys.executable
    with pytest.raises(podenv.ContainerError, match="no command"):
        podenv.container_argv({"args": ["x"]}, env)


async def test_a_worker_pods_identity_is_its_name() -> None:
    """Issue 15 item 3: the operator's TREADLE_WORKER_ID entry resolves to the pod's name,
    so a container restarted in its pod carries the identity of the one that died."""
    from treadle_operator import manifests
    from treadle_operator.models import WorkflowDeploymentSpec

    spec = WorkflowDeploymentSpec.model_validate({"image": "img:1", "module": "m"})
    (entry,) = [e for e in manifests.operator_env(spec, "rev") if e["name"] == "TREADLE_WORKER_ID"]
    env = await podenv.container_env(POD, {"env": [entry]}, _lookup)
    assert env == {"TREADLE_WORKER_ID": "p-1"}
