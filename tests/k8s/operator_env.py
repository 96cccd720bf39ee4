"""The treadle operator under test: a real ``treadle operator`` process, a World, a shop.

``OperatorProcess`` runs ``python -m treadle.cli operator --namespace NS`` against
the test control plane (short reconcile and retry intervals), logging to a file
a failing test prints. ``Shop`` is one namespace with the World's Secret and a
WorkflowDeployment whose workers serve ``k8s_workflows.py``; its helpers create
WorkflowRuns, read them, and run the ``treadle`` CLI against the same World
(what a user does "from outside").
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from treadle.world.records import DeploymentRecord
from treadle.worlds.production import PostgresNatsWorld

from .conftest import POD_ENV
from .harness import Kube, wait_for
from .pod_node import WORKFLOWS as WORKFLOWS  # re-exported: the tests' `treadle start` path
from .pod_node import PodNode
from .rest import ApiError

API = "/apis/treadle.dev/v1alpha1"
FAST = {
    "TREADLE_OPERATOR_RECONCILE_SECONDS": "0.5",
    "TREADLE_OPERATOR_TTL_CHECK_SECONDS": "0.5",
    "TREADLE_OPERATOR_RETRY_SECONDS": "0.5",
    "TREADLE_LOG_LEVEL": "INFO",
}


CHART = Path(__file__).resolve().parents[2] / "charts" / "treadle"
IDENTITY_KINDS = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding")


def chart_identity(
    kube: Kube,
    directory: Path,
    overrides: dict[str, Any] | None = None,
    release_ns: str = "treadle-system",
) -> Path:
    """A kubeconfig for the operator as the Helm chart installs it, and nothing more.

    Creates the chart's ServiceAccount and its RBAC (a ClusterRole and binding, or
    with ``rbac.scope: namespace`` in ``overrides`` a Role and RoleBinding per watched
    namespace), rendered from ``charts/treadle``, asks the API server for a token of
    that account (TokenRequest) and writes a kubeconfig using it: every scenario then
    also checks that the chart's least-privilege RBAC is enough.
    """
    from ..chart.render import render_chart

    def create(path: str, body: dict[str, Any]) -> None:
        # A session fixture imported by several test modules is one instance per module:
        # the same chart objects are made again, identical; keep the first.
        try:
            kube.rest.create(path, body)
        except ApiError as exc:
            if exc.status != 409:
                raise

    create("/api/v1/namespaces", {"metadata": {"name": release_ns}})
    account = ""
    values = {"crds": {"install": False}, **(overrides or {})}
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    for manifest in render_chart(CHART, values, namespace=release_ns):
        body = manifest.body
        kind = body["kind"]
        if kind == "ServiceAccount":
            account = body["metadata"]["name"]
            create(f"/api/v1/namespaces/{release_ns}/serviceaccounts", body)
        elif kind == "ClusterRole":
            create("/apis/rbac.authorization.k8s.io/v1/clusterroles", body)
        elif kind == "ClusterRoleBinding":
            create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", body)
        elif kind in ("Role", "RoleBinding"):
            plural = "roles" if kind == "Role" else "rolebindings"
            create(f"{rbac}/namespaces/{body['metadata']['namespace']}/{plural}", body)
    assert account, "the chart renders a ServiceAccount"
    issued = kube.rest.create(
        f"/api/v1/namespaces/{release_ns}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": 86400}},
    )  # fmt: skip
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "operator",
        "clusters": [{"name": "test", "cluster": {"server": kube.server,
                                                  "insecure-skip-tls-verify": True}}],
        "users": [{"name": "operator", "user": {"token": issued["status"]["token"]}}],
        "contexts": [{"name": "operator", "context": {"cluster": "test", "user": "operator"}}],
    }  # fmt: skip
    path = directory / f"operator-kubeconfig-{release_ns}"
    path.write_text(json.dumps(config))
    return path


@dataclass
class OperatorProcess:
    kube: Kube
    namespace: str
    log_path: Path
    kubeconfig: Path
    proc: subprocess.Popen[bytes] | None = None
    also: tuple[str, ...] = ()  # more namespaces to serve
    extra_env: dict[str, str] = field(default_factory=dict)  # over FAST (a test's own timings)

    def start(self) -> None:
        env = {**os.environ, **POD_ENV, **FAST, "KUBECONFIG": str(self.kubeconfig)}
        env.update(self.extra_env)
        served = [arg for ns in (self.namespace, *self.also) for arg in ("--namespace", ns)]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "treadle.cli", "operator", *served],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def kill(self) -> None:
        """kill -9: no cleanup, no goodbye."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Shop:
    kube: Kube
    namespace: str
    database_url: str
    nats_url: str
    operator: OperatorProcess
    pods: PodNode  # where its worker pods run
    deployment: str = "shop"
    extra: dict[str, Any] = field(default_factory=dict)

    # -- objects ----------------------------------------------------------------------------

    def path(self, plural: str, name: str = "") -> str:
        base = f"{API}/namespaces/{self.namespace}/{plural}"
        return f"{base}/{name}" if name else base

    def secret(
        self, name: str = "treadle-world", namespace: str | None = None, **extra: str
    ) -> None:
        """The World's Secret; ``extra`` adds keys (``**{"payload-key": ...}``)."""
        data = {"database-url": self.database_url, "nats-url": self.nats_url, **extra}
        self.kube.rest.create(
            f"/api/v1/namespaces/{namespace or self.namespace}/secrets",
            {"metadata": {"name": name}, "stringData": data},
        )

    def deploy(self, name: str, image: str, **spec: Any) -> dict[str, Any]:
        body = {
            "apiVersion": "treadle.dev/v1alpha1", "kind": "WorkflowDeployment",
            "metadata": {"name": name},
            "spec": self.pods.worker_spec(
                {"image": image, "orchestrator": {"replicas": 1}, "steps": {"replicas": 1},
                 # Superseded revisions retire 2 s after, not the default 60 s.
                 "retireAfterSeconds": 2, **spec}),
        }  # fmt: skip
        made: dict[str, Any] = self.kube.rest.create(self.path("workflowdeployments"), body)
        return made

    def patch(self, spec: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        """Merge-patch a WorkflowDeployment's ``spec``; a new ``image`` is made on the node
        first (a rollout to a tag no scenario used yet runs, never ErrImageNeverPull)."""
        if isinstance(spec.get("image"), str):
            self.pods.image(spec["image"])
        path = self.path("workflowdeployments", name or self.deployment)
        patched: dict[str, Any] = self.kube.rest.patch(path, {"spec": spec})
        return patched

    @property
    def module(self) -> str:
        """The module path the workers load (what ``deploy`` puts in ``spec.module``)."""
        return self.pods.module

    def report(self, limit: int = 6000) -> str:
        """The operator's log and the worker pods' output (tails), for a failing test."""
        return (
            f"--- operator log of {self.namespace} (tail) ---\n{self.operator.log()[-limit:]}\n"
            f"--- worker pods of {self.namespace} ({self.pods.describe()}) ---\n"
            f"{self.pods.logs_tail(self.namespace)}"
        )

    def wfd(self, name: str | None = None) -> dict[str, Any]:
        found: dict[str, Any] = self.kube.rest.get(
            self.path("workflowdeployments", name or self.deployment)
        )
        return found

    def latest(self, name: str | None = None, timeout: float = 90) -> str:
        """The deployment's latest ready revision, once there is one."""
        return str(
            wait_for(
                lambda: (self.wfd(name).get("status") or {}).get("latestRevision"),
                timeout,
                what=f"a ready revision of {name or self.deployment}",
            )
        )

    def start(self, name: str, workflow: str, input: Any = None, **spec: Any) -> None:
        body = {
            "apiVersion": "treadle.dev/v1alpha1", "kind": "WorkflowRun",
            "metadata": {"name": name},
            "spec": {"deployment": self.deployment, "workflow": workflow, "input": input, **spec},
        }  # fmt: skip
        self.kube.rest.create(self.path("workflowruns"), body)

    def run(self, name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self.kube.rest.find(self.path("workflowruns", name))
        return found

    def status(self, name: str) -> dict[str, Any]:
        found = self.run(name)
        return (found or {}).get("status") or {}

    def phase(self, name: str, *phases: str, timeout: float = 60) -> dict[str, Any]:
        """The run's status once its phase is one of ``phases``."""

        def reached() -> dict[str, Any] | None:
            status = self.status(name)
            return status if status.get("phase") in phases else None

        what = f"WorkflowRun {name} in {phases}"
        found: dict[str, Any] = wait_for(reached, timeout, what=what)
        return found

    def events(self, name: str) -> list[str]:
        listed = self.kube.rest.get(
            f"/api/v1/namespaces/{self.namespace}/events?fieldSelector=involvedObject.name={name}"
        )
        return [e["reason"] for e in listed["items"]]

    # -- the World, from outside ----------------------------------------------------------

    def cli(self, *args: str, revision: str = "outside") -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "TREADLE_WORLD": "postgres",
            "TREADLE_DATABASE_URL": self.database_url,
            "TREADLE_NATS_URL": self.nats_url,
            "TREADLE_DEPLOYMENT_ID": revision,
        }
        return subprocess.run(
            [sys.executable, "-m", "treadle.cli", *args],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    def deployment_record(self, revision: str) -> DeploymentRecord | None:
        """What the World records of a revision (read on a loop of its own)."""

        async def read() -> DeploymentRecord | None:
            world = await PostgresNatsWorld.connect(
                self.database_url, self.nats_url, deployment_id="test-reader"
            )
            try:
                return await world.deployments.get(revision)
            finally:
                await world.close()

        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, read()).result()

    def world_run(self, run_id: str) -> dict[str, Any]:
        done = self.cli("runs", "get", run_id, "--json")
        assert done.returncode == 0, done.stderr
        found: dict[str, Any] = json.loads(done.stdout)
        return found
