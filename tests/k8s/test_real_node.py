"""Real pods on the real node (``real_node``: containerd, runc, the kubelet), loopback only.

Every pod here runs from an image built offline (``node_images``; treadle's is
``docker/Dockerfile`` itself, built by ``dockerfile.py``), with
``hostNetwork: true``, ``enableServiceLinks: false`` and the API server given
explicitly as ``KUBERNETES_SERVICE_HOST=127.0.0.1`` and its port; logs are read
from the runtime's files on the host. The node's own tests: it registered and
is Ready with the taint that keeps the process kubelet's pods off it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from .harness import Kube, wait_for
from .node import REAL_NODE_TAINT, NodeError, NodeUnavailable, RealNode, pod_phase, real_pod
from .node_images import BASE_IMAGE, TREADLE_IMAGE

POD_SECONDS = 90.0


def _run_to_end(kube: Kube, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    """Creates the Pod, waits for Succeeded or Failed, and returns the Pod."""
    name = body["metadata"]["name"]
    kube.rest.create(f"/api/v1/namespaces/{namespace}/pods", body)
    phase = wait_for(
        lambda: (
            pod_phase(kube.rest, name, namespace) in ("Succeeded", "Failed")
            and pod_phase(kube.rest, name, namespace)
        ),
        timeout=POD_SECONDS,
        what=f"pod {namespace}/{name} finishing",
    )
    pod: dict[str, Any] = kube.rest.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    assert phase == pod["status"]["phase"]
    return pod


def _loopback_env(kube: Kube) -> list[dict[str, str]]:
    port = urllib.parse.urlsplit(kube.server).port
    return [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(port)}]  # fmt: skip


def test_the_node_registers_ready_and_tainted(kube: Kube, real_node: RealNode) -> None:
    node = kube.rest.get(f"/api/v1/nodes/{real_node.node_name}")
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True", ready
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.6")
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.20.2"
    taints = [{"key": t["key"], "effect": t["effect"]} for t in node["spec"].get("taints", [])]
    assert REAL_NODE_TAINT in taints


def test_a_host_network_pod_runs_to_succeeded(
    kube: Kube, real_node: RealNode, namespace: str
) -> None:
    script = (
        "import json, os; "
        "print('hello from a real pod'); "
        "print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('KUBERNETES')}))"
    )
    body = real_pod("hello", BASE_IMAGE, ["python3", "-c", script],
                    container={"env": _loopback_env(kube)})  # fmt: skip
    pod = _run_to_end(kube, namespace, body)
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"
    # The container's ID is the runtime's: containerd ran it.
    assert pod["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
    lines = real_node.pod_log("hello", namespace).splitlines()
    assert lines[0] == "hello from a real pod"
    env = json.loads(lines[1])
    # The API server only on loopback, explicitly: never the kubernetes Service's cluster IP.
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert env["KUBERNETES_SERVICE_PORT"] == str(urllib.parse.urlsplit(kube.server).port)


def test_a_failing_command_fails_the_pod_with_its_exit_code(
    kube: Kube, real_node: RealNode, namespace: str
) -> None:
    body = real_pod("fails", BASE_IMAGE, ["python3", "-c", "import sys; sys.exit(3)"])
    pod = _run_to_end(kube, namespace, body)
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3


def test_the_docker_dockerfile_image_runs_worker_and_operator(
    kube: Kube, real_node: RealNode, namespace: str
) -> None:
    """docker/Dockerfile's image (the public file, built FROM the Debian base by
    tests/k8s/dockerfile.py) runs `treadle worker` and `treadle operator` by its
    ENTRYPOINT, as its USER 10001:10001, from its venv on PATH, on a read-only root."""
    restricted = {
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    for command in ("worker", "operator"):
        body = real_pod(
            f"treadle-{command}",
            TREADLE_IMAGE,
            [],
            container={"args": [command, "--help"], "securityContext": restricted},
        )
        del body["spec"]["containers"][0]["command"]  # the image's entrypoint: treadle
        pod = _run_to_end(kube, namespace, body)
        assert pod["status"]["phase"] == "Succeeded", real_node.pod_log(
            f"treadle-{command}", namespace
        )
        assert f"usage: treadle {command}" in real_node.pod_log(f"treadle-{command}", namespace)
    probe = (
        "import os, shutil; print(os.getuid(), os.getgid(), os.getcwd(), shutil.which('treadle'));"
        " open('/home/treadle/x', 'w')"
    )
    # -u: the ids reach the log before the write's traceback (stdout is a pipe there).
    body = real_pod("treadle-readonly", TREADLE_IMAGE, ["python3", "-u", "-c", probe],
                    container={"securityContext": restricted})  # fmt: skip
    pod = _run_to_end(kube, namespace, body)
    log = real_node.pod_log("treadle-readonly", namespace)
    assert pod["status"]["phase"] == "Failed", log
    # The Dockerfile's USER, WORKDIR and the venv its ENV puts first on PATH. stdout and
    # stderr reach the one log file by two pipes: their order is not kept.
    assert "10001 10001 /home/treadle /opt/treadle/bin/treadle" in log.splitlines(), log
    assert "Read-only file system" in log


def _broken_node(kube: Kube, real_node: RealNode, root: Path, **binaries: Path) -> RealNode:
    """A second node whose named binaries are replaced (by scripts that fail)."""
    return RealNode(
        root, dataclasses.replace(real_node.binaries, **binaries), kube.server, kube.token,
        kube.kubeconfig, images=[], node_name="treadle-broken-node", ready_seconds=3.0,
    )  # fmt: skip


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_a_runtime_that_cannot_start_is_one_line_naming_its_log(
    kube: Kube, real_node: RealNode, tmp_path: Path
) -> None:
    broken = _script(tmp_path / "containerd", "echo 'no runtime here' >&2; exit 3")
    node = _broken_node(kube, real_node, tmp_path / "node", containerd=broken)
    with pytest.raises(NodeUnavailable) as caught:
        node.start()
    node.stop()
    log = tmp_path / "node" / "logs" / "containerd.log"
    assert str(caught.value) == f"containerd exited with 3 at start; see {log}"
    assert "no runtime here" in log.read_text()


def test_a_kubelet_that_exits_or_never_readies_is_one_line_naming_its_log(
    kube: Kube, real_node: RealNode, tmp_path: Path
) -> None:
    exits = _script(tmp_path / "kubelet-exits", "echo 'bad flag' >&2; exit 2")
    node = _broken_node(kube, real_node, tmp_path / "a", kubelet=exits)
    with pytest.raises(NodeError) as caught:
        node.start()
    node.stop()
    assert str(caught.value) == f"kubelet exited with 2; see {tmp_path / 'a/logs/kubelet.log'}"
    # A kubelet that runs but never registers: the deadline, not a hang.
    idle = _script(tmp_path / "kubelet-idle", "exec sleep 60")
    node = _broken_node(kube, real_node, tmp_path / "b", kubelet=idle)
    began = time.monotonic()
    with pytest.raises(NodeError) as caught:
        node.start()
    node.stop()
    assert time.monotonic() - began < 30
    assert str(caught.value) == (
        "the kubelet did not make Node treadle-broken-node Ready within 3 s "
        f"(last: not registered); see {tmp_path / 'b/logs/kubelet.log'}"
    )
    assert "\n" not in str(caught.value)


def test_the_kubelet_restarts_a_killed_container_and_acts_on_probes(
    kube: Kube, real_node: RealNode, namespace: str
) -> None:
    """restartPolicy Always: a container killed from the host comes back (restartCount);
    a failing exec liveness probe restarts its container; readiness follows its probe."""
    server = "import time\nopen('/tmp/ready', 'w').close()\nwhile True: time.sleep(1)"
    body = real_pod("sleeper", BASE_IMAGE, ["python3", "-c", server], restartPolicy="Always",
                    container={"readinessProbe": {"exec": {"command": ["test", "-e", "/tmp/ready"]},
                                                  "periodSeconds": 1}})  # fmt: skip
    kube.rest.create(f"/api/v1/namespaces/{namespace}/pods", body)

    def status(name: str = "sleeper") -> dict[str, Any]:
        found: dict[str, Any] = kube.rest.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        statuses: list[dict[str, Any]] = found["status"].get("containerStatuses") or [{}]
        return statuses[0]

    wait_for(lambda: status().get("ready"), POD_SECONDS, what="sleeper ready by its probe")
    container = status()["containerID"].removeprefix("containerd://")
    pid = int(real_node.ctr(["tasks", "ls"], "tasks").split(container, 1)[1].split()[0])
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: status().get("restartCount") == 1 and status().get("ready"), POD_SECONDS,
             what="sleeper restarted by the kubelet and ready again")  # fmt: skip
    assert status()["lastState"]["terminated"]["exitCode"] == 137

    # Liveness: the probe fails from the start, so the kubelet kills and restarts it.
    liveness = {"exec": {"command": ["false"]}, "periodSeconds": 1, "failureThreshold": 1}
    body = real_pod("unwell", BASE_IMAGE, ["python3", "-c", server], restartPolicy="Always",
                    container={"livenessProbe": liveness})  # fmt: skip
    kube.rest.create(f"/api/v1/namespaces/{namespace}/pods", body)
    wait_for(lambda: (status("unwell").get("restartCount") or 0) >= 1, POD_SECONDS,
             what="unwell restarted by its liveness probe")  # fmt: skip
    events = kube.rest.get(
        f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name=unwell"
    )["items"]
    assert any(e["reason"] == "Unhealthy" and "Liveness" in e["message"] for e in events)


def test_what_a_killed_session_left_running_is_ended_by_the_next_node(
    kube: Kube, real_node: RealNode, tmp_path: Path
) -> None:
    """containerd killed as pytest's death would kill it: its container and shim live on,
    until the next node's start sweeps the dead run; a live run is never touched."""
    runs = tmp_path / "runs"
    base = next(i for i in real_node.images if i.name == BASE_IMAGE)
    dead = dataclasses.replace(_broken_node(kube, real_node, tmp_path / "dead"),
                               images=[base], runs=runs)  # fmt: skip
    dead.start_runtime()
    runc_root = dead.root / "runc"  # state in runc_root/k8s.io/ID, as the CRI plugin has it
    dead.ctr(["run", "-d", "--net-host", f"--runc-root={runc_root}", BASE_IMAGE, "orphan",
              "sleep", "600"], "starting the orphan")  # fmt: skip
    pid = int(dead.ctr(["tasks", "ls"], "tasks").split("orphan", 1)[1].split()[0])
    for process in dead.processes:
        process.process.kill()
        process.process.wait()
    os.kill(pid, 0)  # the container outlived its containerd

    live = dataclasses.replace(_broken_node(kube, real_node, tmp_path / "next"), runs=runs)
    live.start_runtime()
    try:
        assert live.swept == [str(dead.root)]
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), 10, what="the orphan ended")
        assert [p.name for p in runs.iterdir()] == [f"{live.cgroup_root.lstrip('/')}.json"]
        # A third start leaves the live run's entry (its containerd runs) alone.
        third = dataclasses.replace(_broken_node(kube, real_node, tmp_path / "third"), runs=runs)
        third.start_runtime()
        third.stop()
        assert third.swept == []
    finally:
        live.stop()
    assert not list(runs.iterdir())
