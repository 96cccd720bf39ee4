"""The process kubelet's Secret and ConfigMap volumes (no cluster needed).

A process cannot see a mount path, so the kubelet writes the volume's files into
the Pod's directory and rewrites env values and arguments under the mountPath
(review R9: workers read ``TREADLE_*_URL_FILE`` from the World Secret's volume).
Objects come from a dict standing in for the API reads, as in ``test_podenv.py``;
``test_operator_rotation.py`` runs real workers on such a volume where the real node
cannot start (the process kubelet is the fallback of ``pod_node.py``).
"""

from __future__ import annotations

import asyncio
import base64
import stat
from pathlib import Path
from typing import Any

import pytest

from . import podenv
from .kubelet import PodState, ProcessKubelet

OBJECTS: dict[tuple[str, str], dict[str, Any]] = {
    ("secrets", "world"): {"data": {
        "database-url": base64.b64encode(b"postgresql://u@h/d\n").decode(),
        "keystore": base64.b64encode(b"\xff\x00binary").decode(),
    }},
    ("configmaps", "cfg"): {"data": {"a.txt": "A"}, "binaryData": {"b.bin": "AAE="}},
}  # fmt: skip


def _kubelet(tmp_path: Path) -> ProcessKubelet:
    kubelet = ProcessKubelet("https://unused", "t", tmp_path)

    async def lookup(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert namespace == "ns"
        return OBJECTS.get((kind, name))

    kubelet._lookup = lookup  # type: ignore[method-assign]
    return kubelet


def _pod(tmp_path: Path, volumes: list[dict[str, Any]], env_value: str) -> PodState:
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {
            "volumes": [*volumes, {"name": "tmp", "emptyDir": {}}],
            "containers": [{
                "name": "c", "command": ["python"], "args": ["-c", "pass", env_value],
                "env": [{"name": "URL_FILE", "value": env_value}],
                "volumeMounts": [
                    {"name": v["name"], "mountPath": f"/etc/{v['name']}", "readOnly": True}
                    for v in volumes
                ] + [{"name": "tmp", "mountPath": "/tmp"}],
            }],
        },
    }  # fmt: skip
    return PodState(pod=pod, directory=tmp_path / "pod")


def test_secret_items_become_files_with_their_mode_and_paths_are_rewritten(
    tmp_path: Path,
) -> None:
    volume = {"name": "world", "secret": {"secretName": "world", "defaultMode": 0o440,
              "items": [{"key": "database-url", "path": "database-url"}]}}  # fmt: skip
    state = _pod(tmp_path, [volume], "/etc/world/database-url")
    argv, env = asyncio.run(_kubelet(tmp_path)._prepare(state))
    local = tmp_path / "pod" / "volumes" / "world" / "database-url"
    assert env["URL_FILE"] == str(local) and argv[-1] == str(local)
    assert local.read_bytes() == b"postgresql://u@h/d\n"
    assert stat.S_IMODE(local.stat().st_mode) == 0o440
    assert not (local.parent / "keystore").exists()  # only the items asked for


def test_a_configmap_without_items_gives_every_key_binary_included(tmp_path: Path) -> None:
    state = _pod(tmp_path, [{"name": "cfg", "configMap": {"name": "cfg"}}], "/etc/cfg")
    _, env = asyncio.run(_kubelet(tmp_path)._prepare(state))
    directory = Path(env["URL_FILE"])
    assert (directory / "a.txt").read_text() == "A"
    assert (directory / "b.bin").read_bytes() == b"\x00\x01"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"secretName": "absent"}, "Secret ns/absent not found"),
        ({"secretName": "world", "items": [{"key": "nope", "path": "x"}]},
         "couldn't find key nope in Secret ns/world"),
    ],
    ids=["no-secret", "no-key"],
)  # fmt: skip
def test_a_missing_secret_or_key_keeps_the_container_creating(
    tmp_path: Path, source: dict[str, Any], message: str
) -> None:
    state = _pod(tmp_path, [{"name": "world", "secret": source}], "/etc/world/x")
    with pytest.raises(podenv.ContainerError) as error:
        asyncio.run(_kubelet(tmp_path)._prepare(state))
    assert error.value.reason == "ContainerCreating"
    assert message in error.value.message


def test_an_optional_missing_secret_mounts_an_empty_directory(tmp_path: Path) -> None:
    source = {"secretName": "absent", "optional": True}
    state = _pod(tmp_path, [{"name": "world", "secret": source}], "/etc/world/x")
    _, env = asyncio.run(_kubelet(tmp_path)._prepare(state))
    assert not Path(env["URL_FILE"]).exists() and Path(env["URL_FILE"]).parent.is_dir()
