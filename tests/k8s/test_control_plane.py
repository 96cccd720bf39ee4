"""The k8s test harness against the real API server: scheduling, pod processes, status, GC.

Each test pins one promise the operator tests rely on: a Deployment's Pod really
runs as a local process with a kubelet's environment; a crashing container backs
off with the stderr tail in ``lastState``; deleting a Deployment terminates its
process (SIGTERM first, SIGKILL after the grace period); a missing Secret is a
``CreateContainerConfigError`` until it exists; the API server enforces a CRD's
schema with 422. Its pod tests are about the process kubelet itself, the node
worker pods fall back to where the real node cannot start (``pod_node.py``), so
they stay on it.
"""

from __future__ import annotations

import base64
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from .harness import WIDGET_GROUP, Kube, wait_for, wait_for_async

WRITE_ENV_AND_WAIT = """
import json, os, pathlib, signal, sys, time
names = ["GREETING", "POD", "NS", "APP", "CFG_MODE", "TREADLE_POD_IMAGE", "TREADLE_POD_NAME"]
out = pathlib.Path(os.environ["OUT"])
def on_term(signum, frame):
    out.with_suffix(".term").write_text("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
tmp = out.with_suffix(".tmp")
tmp.write_text(json.dumps({n: os.environ.get(n) for n in names} | {"cwd": os.getcwd()}))
tmp.rename(out)
while True:
    time.sleep(60)
"""


def _deployment(name: str, container: dict[str, Any]) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


def _pod(name: str, code: str, **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "python:harness", "command": ["python", "-c", code]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [container], **spec}}  # fmt: skip


def _secret(name: str, **data: str) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": encoded}


def _container_status(kube: Kube, namespace: str, pod: str) -> dict[str, Any]:
    status = kube.rest.get(f"/api/v1/namespaces/{namespace}/pods/{pod}").get("status", {})
    return dict((status.get("containerStatuses") or [{}])[0])


def _only_pod(kube: Kube, namespace: str, app: str) -> str:
    pods = wait_for(lambda: kube.pods(namespace, f"app={app}"), what=f"a pod for {app}")
    assert len(pods) == 1
    metadata: dict[str, str] = pods[0]["metadata"]  # type: ignore[assignment]
    return metadata["name"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_deployment_pod_runs_as_a_local_process_with_a_kubelets_env(
    kube: Kube, namespace: str, tmp_path: Path
) -> None:
    """The controllers make a Pod, the scheduler binds it, the kubelet runs it with its env."""
    ns = f"/api/v1/namespaces/{namespace}"
    kube.rest.create(f"{ns}/secrets", _secret("app-secret", greeting="hello from a secret"))
    kube.rest.create(
        f"{ns}/configmaps", {"metadata": {"name": "app-config"}, "data": {"MODE": "x"}}
    )
    out = tmp_path / "env.json"
    secret_key = {"name": "app-secret", "key": "greeting"}
    container = {
        "name": "main",
        "image": "registry.example/app:7",
        "command": ["python", "-c", WRITE_ENV_AND_WAIT],
        "envFrom": [{"configMapRef": {"name": "app-config"}, "prefix": "CFG_"}],
        "env": [
            {"name": "OUT", "value": str(out)},
            {"name": "GREETING", "valueFrom": {"secretKeyRef": secret_key}},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        ],
    }  # fmt: skip
    kube.rest.create(
        f"/apis/apps/v1/namespaces/{namespace}/deployments", _deployment("app", container)
    )
    pod = _only_pod(kube, namespace, "app")

    wait_for(out.exists, what="the pod's process writing its env")
    seen = json.loads(out.read_text())
    assert seen["GREETING"] == "hello from a secret"
    assert (seen["POD"], seen["NS"], seen["APP"]) == (pod, namespace, "app")
    assert seen["CFG_MODE"] == "x"
    assert seen["TREADLE_POD_IMAGE"] == "registry.example/app:7"
    assert seen["TREADLE_POD_NAME"] == pod
    assert seen["cwd"] == str(kube.kubelet.pod_directory(pod, namespace))
    # The Deployment controller counts the Pod available: the kubelet reported it Ready.
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/app"
    wait_for(lambda: kube.rest.get(path).get("status", {}).get("availableReplicas") == 1)
    status = _container_status(kube, namespace, pod)
    assert status["ready"] is True and "running" in status["state"]
    assert kube.pod_pid(pod, namespace) is not None


def test_a_treadle_command_runs_this_checkouts_treadle_to_completion(
    kube: Kube, namespace: str
) -> None:
    """``treadle --help`` runs as ``python -m treadle.cli``; restartPolicy Never: Succeeded."""
    pod = _pod("cli", "", restartPolicy="Never")
    pod["spec"]["containers"][0]["command"] = ["treadle", "--help"]
    pods = f"/api/v1/namespaces/{namespace}/pods"
    kube.rest.create(pods, pod)

    def finished() -> dict[str, Any] | None:
        status: dict[str, Any] = kube.rest.get(f"{pods}/cli").get("status", {})
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    status = wait_for(finished, what="the treadle command finished")
    assert status["phase"] == "Succeeded", kube.pod_log("cli", namespace, "stderr")
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    assert kube.pod_log("cli", namespace).startswith("usage: treadle")


def test_crashing_container_shows_crash_loop_back_off_with_the_stderr_tail(
    kube: Kube, namespace: str
) -> None:
    """Exit 3 under restartPolicy Always: restarts, lastState.terminated, CrashLoopBackOff."""
    code = "import sys; sys.stderr.write('noise ' * 400 + '\\nboom: the end\\n'); sys.exit(3)"
    kube.rest.create(f"/api/v1/namespaces/{namespace}/pods", _pod("crasher", code))

    def backing_off_after_two_runs() -> dict[str, Any] | None:
        status = _container_status(kube, namespace, "crasher")
        waiting = status.get("state", {}).get("waiting", {})
        backing_off = waiting.get("reason") == "CrashLoopBackOff"
        return status if backing_off and status["restartCount"] >= 2 else None

    status = wait_for(backing_off_after_two_runs, what="CrashLoopBackOff after two runs")
    terminated = status["lastState"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")
    assert terminated["message"].endswith("boom: the end\n")
    assert 0 < len(terminated["message"].encode()) <= 1024
    assert status["ready"] is False
    assert kube.pod_log("crasher", namespace, "stderr").count("boom: the end") >= 2
    assert "--- pod crasher stderr:" in kube.logs_tail(namespace)


def test_killed_process_is_restarted_with_exit_code_137(kube: Kube, namespace: str) -> None:
    """kill_pod_process(SIGKILL) is a container crash: a new process, lastState 137."""
    kube.rest.create(
        f"/api/v1/namespaces/{namespace}/pods", _pod("victim", "import time; time.sleep(600)")
    )
    first = wait_for(lambda: kube.pod_pid("victim", namespace), what="the first process")
    kube.kill_pod_process("victim", signal.SIGKILL, namespace)

    def restarted() -> int | None:
        pid = kube.pod_pid("victim", namespace)
        return pid if pid != first else None

    second = wait_for(restarted, what="a new process")
    assert second != first
    status = wait_for(lambda: _container_status(kube, namespace, "victim").get("lastState"))
    assert status["terminated"]["exitCode"] == 128 + signal.SIGKILL
    assert _container_status(kube, namespace, "victim")["restartCount"] == 1


def test_deleting_the_deployment_terminates_its_process_with_sigterm(
    kube: Kube, namespace: str, tmp_path: Path
) -> None:
    """Garbage collection deletes the Pod; the kubelet sends SIGTERM and removes it."""
    kube.rest.create(f"/api/v1/namespaces/{namespace}/secrets", _secret("app-secret", greeting="x"))
    out = tmp_path / "env.json"
    container = {
        "name": "main",
        "image": "python:harness",
        "command": ["python", "-c", WRITE_ENV_AND_WAIT],
        "env": [{"name": "OUT", "value": str(out)}],
    }
    deployments = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    kube.rest.create(deployments, _deployment("doomed", container))
    pod = _only_pod(kube, namespace, "doomed")
    wait_for(out.exists, what="the pod's process running")
    pid = kube.pod_pid(pod, namespace)
    assert pid is not None and _alive(pid)

    kube.rest.delete(f"{deployments}/doomed", {"propagationPolicy": "Background"})
    wait_for(lambda: not kube.pods(namespace, "app=doomed"), what="the pod gone")
    assert out.with_suffix(".term").read_text() == "SIGTERM"
    assert not _alive(pid)


def test_process_ignoring_sigterm_is_killed_after_the_grace_period(
    kube: Kube, namespace: str
) -> None:
    """terminationGracePeriodSeconds 1: SIGKILL follows, and the Pod is removed."""
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    pods = f"/api/v1/namespaces/{namespace}/pods"
    kube.rest.create(pods, _pod("stubborn", code, terminationGracePeriodSeconds=1))
    pid = wait_for(lambda: kube.pod_pid("stubborn", namespace), what="the process")
    kube.rest.delete(f"{pods}/stubborn")
    wait_for(lambda: kube.rest.find(f"{pods}/stubborn") is None, timeout=10, what="pod removed")
    assert not _alive(pid)
    assert kube.kubelet.pod_directory("stubborn", namespace).is_dir()  # kept for its logs


def test_missing_secret_is_create_container_config_error_until_it_exists(
    kube: Kube, namespace: str
) -> None:
    """The container does not start without its Secret; it starts once the Secret appears."""
    pod = _pod("needs-secret", "import time; time.sleep(600)")
    pod["spec"]["containers"][0]["env"] = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "later", "key": "token"}}}
    ]
    ns = f"/api/v1/namespaces/{namespace}"
    kube.rest.create(f"{ns}/pods", pod)

    def waiting() -> dict[str, Any]:
        state = _container_status(kube, namespace, "needs-secret").get("state", {})
        return dict(state.get("waiting", {}))

    reason = wait_for(waiting, what="a waiting container")
    assert reason["reason"] == "CreateContainerConfigError"
    assert '"later"' in reason["message"]
    assert kube.pod_pid("needs-secret", namespace) is None

    kube.rest.create(f"{ns}/secrets", _secret("later", token="t"))
    wait_for(lambda: kube.pod_pid("needs-secret", namespace), what="the container started")
    running = wait_for(lambda: _container_status(kube, namespace, "needs-secret")["ready"])
    assert running is True


async def test_custom_resource_violating_the_crd_schema_is_refused_with_422(
    kube: Kube, namespace: str, widget_crd: str
) -> None:
    """Through kubernetes_asyncio: a valid Widget is stored; size 0 and no size are 422."""
    group, version, plural = WIDGET_GROUP, "v1", "widgets"

    def widget(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": f"{group}/{version}", "kind": "Widget",
                "metadata": {"name": name}, "spec": spec}  # fmt: skip

    async with kube.api_client() as api:
        custom = client.CustomObjectsApi(api)
        stored = await custom.create_namespaced_custom_object(
            group, version, namespace, plural, widget("fine", {"size": 2})
        )
        assert stored["metadata"]["generation"] == 1
        for name, spec in (("zero", {"size": 0}), ("missing", {})):
            with pytest.raises(ApiException) as refused:
                await custom.create_namespaced_custom_object(
                    group, version, namespace, plural, widget(name, spec)
                )
            assert refused.value.status == 422, name

        async def listed() -> list[str]:
            found = await custom.list_namespaced_custom_object(group, version, namespace, plural)
            return [item["metadata"]["name"] for item in found["items"]]

        assert await wait_for_async(listed) == ["fine"]
