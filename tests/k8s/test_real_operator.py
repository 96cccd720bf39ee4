"""The chart's operator Deployment as a real pod from treadle's image, on the real node.

Treadle's image is ``docker/Dockerfile`` itself, built FROM the node's Debian
base (``node_images.NodeImages.treadle``); the workflows image is built FROM it.

The Deployment is the one ``charts/treadle`` renders (namespace-scoped RBAC for
one namespace, the webhook off), made to run here by ``in_cluster_on_real_node``
(host network, API server on 127.0.0.1, the service-account token volume). The
real controllers make its pod, the real kubelet runs it with the chart's
restricted securityContext (non-root 10001, read-only root filesystem), and
the operator logs in with the mounted token: its readiness probe passes only
once kopf watches, and the API server's audit log shows the service account's
requests.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ..chart.render import render_chart
from ..nats.conftest import NatsServer, nats_server
from ..postgres.conftest import Clones, pg_clones, pg_server
from ..postgres.pgserver import Server as PgServer
from .harness import Kube, wait_for
from .node import REAL_NODE_NAME, RealNode, api_ca_configmap, in_cluster_on_real_node
from .node_images import TREADLE_IMAGE, WORKFLOWS_IMAGE, WORKFLOWS_MODULE
from .operator_env import CHART, OperatorProcess, Shop, chart_identity
from .pod_node import PodNode
from .processes import free_port

__all__ = ["nats_server", "pg_clones", "pg_server"]
_shops = itertools.count(1)

READY_SECONDS = 120.0


def _values(namespace: str, probe_port: int) -> dict[str, Any]:
    repository, tag = TREADLE_IMAGE.rsplit(":", 1)
    return {
        "crds": {"install": False},
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "rbac": {"scope": "namespace", "namespaces": [namespace]},
        "webhook": {"enabled": False},
        # Host network: the probe port is a port of this machine, on loopback only.
        "probes": {"port": probe_port},
        "extraEnv": [{"name": "TREADLE_OPERATOR_PROBE_HOST", "value": "127.0.0.1"}],
    }


def _operator_deployment(values: dict[str, Any], namespace: str) -> dict[str, Any]:
    for manifest in render_chart(CHART, values, namespace=namespace):
        if manifest.kind == "Deployment" and manifest.body["metadata"]["name"].endswith(
            "-operator"
        ):
            return manifest.body
    raise AssertionError("the chart renders no operator Deployment")


def test_the_charts_operator_runs_in_cluster_with_its_service_account(
    kube: Kube, real_node: RealNode, namespace: str, tmp_path: Path
) -> None:
    values = _values(namespace, free_port())
    chart_identity(kube, tmp_path, values, release_ns=namespace)
    deployment = _operator_deployment(values, namespace)
    template = deployment["spec"]["template"]
    api_port = urllib.parse.urlsplit(kube.server).port
    assert api_port is not None
    template["spec"] = in_cluster_on_real_node(template["spec"], api_port)
    kube.rest.create(
        f"/api/v1/namespaces/{namespace}/configmaps",
        api_ca_configmap(kube.control_plane.root),
    )
    kube.rest.create(f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment)
    name = deployment["metadata"]["name"]
    account = template["spec"]["serviceAccountName"]

    def ready() -> bool:
        status = kube.rest.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
        return (status.get("status") or {}).get("readyReplicas") == 1

    selector = ",".join(
        f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items()
    )

    def explain() -> str:
        pods = kube.pods(namespace, selector)
        logs = [real_node.pod_log(str(p["metadata"]["name"]), namespace) for p in pods]  # type: ignore[index]
        return (
            json.dumps([p.get("status") for p in pods], indent=1)[-3000:]
            + "\n"
            + "\n".join(logs)[-3000:]
        )

    try:
        wait_for(ready, timeout=READY_SECONDS, what=f"the operator Deployment {name} Ready")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{explain()}") from None
    (pod,) = kube.pods(namespace, selector)
    spec: Any = pod["spec"]
    status: Any = pod["status"]
    assert spec["nodeName"] == REAL_NODE_NAME
    assert status["containerStatuses"][0]["containerID"].startswith("containerd://")
    assert status["containerStatuses"][0]["ready"] is True
    # The API server saw the operator's requests as the chart's service account.
    user = f"system:serviceaccount:{namespace}:{account}"

    def audited() -> list[dict[str, Any]]:
        text = kube.control_plane.audit_log.read_text(errors="replace")
        events = [json.loads(line) for line in text.splitlines() if user in line]
        return [e for e in events if e["user"]["username"] == user]

    events = wait_for(audited, what=f"requests by {user} in the audit log")
    assert {ip for e in events for ip in e.get("sourceIPs", [])} <= {"127.0.0.1"}


@pytest.fixture
def real_shop(
    kube: Kube,
    pod_node: PodNode,
    real_node: RealNode,
    pg_server: PgServer,
    pg_clones: Clones,
    nats_server: NatsServer,
    tmp_path: Path,
) -> Iterator[Shop]:
    """A namespace with the World's Secret and a host ``treadle operator`` (the chart's
    identity); its WorkflowDeployments' workers run as real pods on the real node."""
    namespace = f"real-shop-{next(_shops)}"
    kube.rest.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    # The chart's cluster-wide identity, one a session (its ClusterRoleBinding names one
    # ServiceAccount: a second release namespace would get a binding-less account).
    identity = chart_identity(kube, tmp_path)
    with ThreadPoolExecutor(max_workers=1) as pool:
        database = pool.submit(asyncio.run, pg_clones.take()).result()
    shop = Shop(
        kube=kube,
        namespace=namespace,
        database_url=pg_server.dsn(database),
        nats_url=nats_server.url,
        operator=OperatorProcess(kube, namespace, tmp_path / "operator.log", identity),
        pods=pod_node,
    )
    shop.secret()
    shop.operator.start()
    yield shop
    shop.operator.stop()
    print(f"--- operator log of {namespace} (tail) ---\n{shop.operator.log()[-4000:]}")
    for pod in kube.pods(namespace):
        name = str(pod["metadata"]["name"])  # type: ignore[index]
        state = json.dumps(pod.get("status"))[-1500:]
        print(f"--- pod {name} (tail) ---\n{state}\n{real_node.pod_log(name, namespace)[-2000:]}")
    wfds = kube.rest.get(f"/apis/treadle.dev/v1alpha1/namespaces/{namespace}/workflowdeployments")
    print(json.dumps([w.get("status") for w in wfds["items"]])[-3000:])
    kube.rest.delete(f"/api/v1/namespaces/{namespace}")


def _on_real_node(api_port: int) -> dict[str, Any]:
    """The WorkflowDeployment's ``spec.template``: its workers on the real node, loopback."""
    spec = in_cluster_on_real_node({"containers": [{"name": "worker"}]}, api_port)
    # Workers talk to the World, not to the API server: no token, no API volume.
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "kube-api"]
    for container in spec["containers"]:
        del container["volumeMounts"], container["imagePullPolicy"]
    del spec["automountServiceAccountToken"]
    # The operator's default pod securityContext has the fsGroup that makes the World
    # Secret's 0440 files readable to the image's user, and a hostNetwork template makes
    # the workers declare no port (which would be a host port: one worker a node): found
    # here, on the real kubelet, and fixed in the operator (docs/plans/s9-kn.md).
    return {"spec": spec}


def test_a_deployment_on_real_pods_runs_a_workflow_to_completion(
    kube: Kube, real_node: RealNode, real_shop: Shop
) -> None:
    """apply -> the real kubelet runs the worker pods from the workflows image -> a
    WorkflowRun completes, its status synced from the World."""
    api_port = urllib.parse.urlsplit(kube.server).port
    assert api_port is not None
    real_shop.deploy(
        real_shop.deployment,
        WORKFLOWS_IMAGE,
        module=WORKFLOWS_MODULE,
        imagePullPolicy="Never",
        template=_on_real_node(api_port),
    )
    revision = real_shop.latest(timeout=READY_SECONDS)
    pods = kube.pods(real_shop.namespace, f"treadle.dev/revision={revision}")
    assert {p["spec"]["nodeName"] for p in pods} == {REAL_NODE_NAME}  # type: ignore[index]
    assert all(
        s["containerID"].startswith("containerd://")
        for p in pods
        for s in p["status"]["containerStatuses"]  # type: ignore[index]
    )
    real_shop.start("hello", "greet", {"name": "real pods"})
    status = real_shop.phase("hello", "Completed", timeout=READY_SECONDS)
    assert status["revision"] == revision
    assert json.loads(status["output"])["hello"] == "real pods"
    assert real_shop.world_run(status["runId"])["status"] == "completed"


def test_a_crash_looping_worker_image_is_reported_by_the_condition(
    kube: Kube, real_node: RealNode, real_shop: Shop
) -> None:
    """A revision whose workers exit at once (its module is not in the image): the real
    kubelet backs off (CrashLoopBackOff), and the WorkflowDeployment says Stalled."""
    api_port = urllib.parse.urlsplit(kube.server).port
    assert api_port is not None
    real_shop.deploy(
        real_shop.deployment,
        WORKFLOWS_IMAGE,
        module="/app/not_in_the_image.py",
        imagePullPolicy="Never",
        template=_on_real_node(api_port),
    )

    def stalled() -> dict[str, Any]:
        conditions = (real_shop.wfd().get("status") or {}).get("conditions") or []
        found = {c["type"]: c for c in conditions}.get("Stalled")
        return (
            found if found and found["status"] == "True" and found["reason"] == "CrashLoop" else {}
        )

    condition = wait_for(stalled, timeout=READY_SECONDS, what="Stalled=True, reason CrashLoop")
    message = str(condition["message"])
    assert "CrashLoopBackOff" in message or "not_in_the_image" in message, condition
    pods: list[Any] = kube.pods(real_shop.namespace)
    restarts = [
        s.get("restartCount", 0)
        for p in pods
        for s in (p.get("status") or {}).get("containerStatuses", [])
    ]
    assert max(restarts) >= 1
    assert (real_shop.wfd().get("status") or {}).get("latestRevision") is None


def test_an_image_the_node_lacks_is_reported_as_an_image_pull_stall(
    kube: Kube, real_node: RealNode, real_shop: Shop
) -> None:
    """A revision whose image the node does not have, pull policy Never: the real kubelet
    leaves its workers waiting (ErrImageNeverPull), and the WorkflowDeployment says
    Stalled, reason ImagePull, naming it (it once said healthy while nothing ran)."""
    api_port = urllib.parse.urlsplit(kube.server).port
    assert api_port is not None
    real_shop.deploy(
        real_shop.deployment,
        "treadle-test/not-on-this-node:1",
        module=WORKFLOWS_MODULE,
        imagePullPolicy="Never",
        template=_on_real_node(api_port),
    )

    def stalled() -> dict[str, Any]:
        conditions = (real_shop.wfd().get("status") or {}).get("conditions") or []
        found = {c["type"]: c for c in conditions}.get("Stalled")
        return (
            found if found and found["status"] == "True" and found["reason"] == "ImagePull" else {}
        )

    condition = wait_for(stalled, timeout=READY_SECONDS, what="Stalled=True, reason ImagePull")
    assert "ErrImageNeverPull" in str(condition["message"]), condition
    assert (real_shop.wfd().get("status") or {}).get("latestRevision") is None


def _deploy_on_real_node(shop: Shop, kube: Kube) -> str:
    api_port = urllib.parse.urlsplit(kube.server).port
    assert api_port is not None
    shop.deploy(shop.deployment, WORKFLOWS_IMAGE, module=WORKFLOWS_MODULE,
                imagePullPolicy="Never", template=_on_real_node(api_port))  # fmt: skip
    return shop.latest(timeout=READY_SECONDS)


def test_a_rollout_on_real_pods_leaves_a_waiting_run_on_its_revision(
    kube: Kube, real_node: RealNode, real_shop: Shop
) -> None:
    """A new image (a second tag of the workflows image, in the runtime) makes a new
    revision whose real pods take new runs; the waiting run finishes on the old one."""
    old = _deploy_on_real_node(real_shop, kube)
    second = WORKFLOWS_IMAGE.rsplit(":", 1)[0] + ":v2"
    real_node.ctr(["images", "tag", "--force", WORKFLOWS_IMAGE, second], f"tagging {second}")
    real_shop.start("long", "approval", {"order_id": "long"})
    wait_for(lambda: real_shop.status("long").get("waitingOn"), 60, what="the long run waiting")

    path = real_shop.path("workflowdeployments", real_shop.deployment)
    kube.rest.patch(path, {"spec": {"image": second}})
    new = wait_for(
        lambda: real_shop.latest(timeout=READY_SECONDS) != old and real_shop.latest(),
        READY_SECONDS,
        what="a new revision on real pods",
    )
    pods = kube.pods(real_shop.namespace, f"treadle.dev/revision={new}")
    # (The runtime reports an image by its first name: both tags are one image id.)
    assert {p["spec"]["containers"][0]["image"] for p in pods} == {second}  # type: ignore[index]
    assert all(p["status"]["containerStatuses"][0]["state"].get("running") for p in pods)  # type: ignore[index]
    revisions = {r["id"]: r for r in real_shop.wfd()["status"]["revisions"]}
    assert revisions[old]["activeRuns"] == 1
    assert kube.pods(real_shop.namespace, f"treadle.dev/revision={old}")

    real_shop.start("fresh", "greet", {"name": "new"})
    assert real_shop.phase("fresh", "Completed", timeout=READY_SECONDS)["revision"] == new
    resumed = real_shop.cli("hooks", "resume", "approve:long", "--payload", '{"approved": true}')
    assert resumed.returncode == 0, resumed.stderr
    long = real_shop.phase("long", "Completed", timeout=READY_SECONDS)
    assert long["revision"] == old
    assert json.loads(long["output"])["approved"] is True


def test_a_worker_killed_under_a_run_is_restarted_by_the_kubelet_and_the_run_completes(
    kube: Kube, real_node: RealNode, real_shop: Shop
) -> None:
    """kill -9 of the orchestrator's container while its run waits: the real kubelet
    restarts the container in its pod, and the run, resumed, completes."""
    revision = _deploy_on_real_node(real_shop, kube)
    real_shop.start("held", "approval", {"order_id": "held"})
    wait_for(lambda: real_shop.status("held").get("waitingOn"), 60, what="the run waiting")
    selector = f"treadle.dev/revision={revision},treadle.dev/role=orchestrator"
    (pod,) = kube.pods(real_shop.namespace, selector)
    status: Any = pod["status"]
    container = status["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    pid = int(real_node.ctr(["tasks", "ls"], "tasks").split(container, 1)[1].split()[0])
    os.kill(pid, signal.SIGKILL)

    def restarted() -> bool:
        (now,) = kube.pods(real_shop.namespace, selector)
        state: Any = now["status"]["containerStatuses"][0]  # type: ignore[index]
        return bool(state["restartCount"] >= 1 and "running" in state["state"])

    wait_for(restarted, READY_SECONDS, what="the orchestrator restarted in its pod")
    resumed = real_shop.cli("hooks", "resume", "approve:held", "--payload", '{"approved": true}')
    assert resumed.returncode == 0, resumed.stderr
    held = real_shop.phase("held", "Completed", timeout=READY_SECONDS)
    assert held["revision"] == revision
    assert json.loads(held["output"])["approved"] is True
