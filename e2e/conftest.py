"""End-to-end fixtures: the treadle image, the chart and the operator on a kind cluster.

Run with ``python -m pytest e2e`` after ``pip install -e '.[dev,e2e]'``; the default
``pytest`` run never collects this folder (``testpaths`` is ``tests``). It needs a
Docker engine, kind (brought by pytest-kind) and ``helm``; where one is missing every
test here is skipped with a reason naming it, printed in the report header too.

Once per session: build ``docker/Dockerfile`` and two workflow images from
``e2e/workflows`` (the same module under two tags, so a WorkflowDeployment can roll
out), load them into kind, start PostgreSQL and NATS (``e2e/manifests/world.yaml``),
install the chart with a World Secret, and apply the World's migrations with a Job.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
NAMESPACE = "treadle-e2e"
BASE_IMAGE = "treadle:e2e"
WORKFLOW_IMAGES = ("treadle-e2e-workflows:1", "treadle-e2e-workflows:2")
WORLD_SECRET = "treadle-world"
DATABASE_URL = f"postgresql://treadle:treadle@postgres.{NAMESPACE}:5432/treadle"
NATS_URL = f"nats://nats.{NAMESPACE}:4222"


def missing_prerequisites() -> list[str]:
    """What this machine lacks for the e2e suite; empty when it can run."""
    missing: list[str] = []
    docker = shutil.which("docker")
    if docker is None:
        missing.append("docker is not installed")
    else:
        try:
            probe = subprocess.run(
                [docker, "info", "--format", "{{.ServerVersion}}"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            reached = probe.returncode == 0 and probe.stdout.strip() != ""
            detail = (probe.stderr.strip().splitlines() or ["no server version"])[-1]
        except subprocess.TimeoutExpired:
            reached, detail = False, "docker info timed out"
        if not reached:
            missing.append(f"docker reaches no engine ({detail})")
    if importlib.util.find_spec("pytest_kind") is None:
        missing.append(
            "kind is unavailable: pytest-kind is not installed (pip install -e '.[e2e]')"
        )
    if shutil.which("helm") is None:
        missing.append("helm is not installed")
    return missing


def _skip_reason(config: pytest.Config) -> str | None:
    if not hasattr(config, "_treadle_e2e_missing"):
        config._treadle_e2e_missing = missing_prerequisites()  # type: ignore[attr-defined]
    missing: list[str] = config._treadle_e2e_missing  # type: ignore[attr-defined]
    return "e2e skipped: " + "; ".join(missing) if missing else None


def pytest_report_header(config: pytest.Config) -> str | None:
    return _skip_reason(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _skip_reason(config)
    if reason is None:
        return
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.skip(reason=reason))


def _run(argv: list[str], *, stdin: str | None = None, timeout: float = 600) -> str:
    result = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(argv[:4])} ... failed:\n{result.stdout}{result.stderr}")
    return result.stdout


@dataclass(frozen=True)
class Kube:
    """kubectl and helm against the kind cluster, in the suite's namespace."""

    kubectl_path: Path
    kubeconfig: Path

    def kubectl(self, *argv: str, stdin: str | None = None, timeout: float = 300) -> str:
        base = [str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig), "-n", NAMESPACE]
        return _run([*base, *argv], stdin=stdin, timeout=timeout)

    def helm(self, *argv: str) -> str:
        helm = shutil.which("helm")
        assert helm is not None
        return _run([helm, "--kubeconfig", str(self.kubeconfig), "-n", NAMESPACE, *argv])

    def apply(self, body: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", stdin=json.dumps(body))

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.kubectl("get", kind, name, "-o", "json"))
        return found

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 300) -> Any:
        """Poll ``check`` (a read of cluster state) until it returns something truthy."""
        deadline = time.monotonic() + timeout
        while True:
            found = check()
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(2)

    def run_treadle(self, name: str, *argv: str) -> str:
        """Run ``treadle ARGV`` in a Job against the World and return what it printed."""
        env = [
            {"name": "TREADLE_WORLD", "value": "postgres"},
            *(
                {
                    "name": variable,
                    "valueFrom": {"secretKeyRef": {"name": WORLD_SECRET, "key": key}},
                }
                for variable, key in (
                    ("TREADLE_DATABASE_URL", "database-url"),
                    ("TREADLE_NATS_URL", "nats-url"),
                )
            ),
        ]
        self.apply(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name},
                "spec": {
                    "backoffLimit": 10,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "treadle",
                                    "image": BASE_IMAGE,
                                    "args": list(argv),
                                    "env": env,
                                }
                            ],
                        }
                    },
                },
            }
        )
        self.kubectl(
            "wait", "--for=condition=complete", f"job/{name}", "--timeout=300s", timeout=330
        )
        return self.kubectl("logs", f"job/{name}")


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Kube:
    """The kind cluster of pytest-kind's ``kind_cluster`` fixture, with the images loaded."""
    kind_cluster = request.getfixturevalue("kind_cluster")
    environment = {**os.environ, "DOCKER_BUILDKIT": "1"}
    docker = shutil.which("docker")
    assert docker is not None
    subprocess.run(
        [docker, "build", "-f", str(ROOT / "docker" / "Dockerfile"), "-t", BASE_IMAGE, str(ROOT)],
        check=True,
        env=environment,
    )
    for revision, image in enumerate(WORKFLOW_IMAGES, start=1):
        subprocess.run(
            [
                docker,
                "build",
                "-t",
                image,
                "--build-arg",
                f"BASE={BASE_IMAGE}",
                "--build-arg",
                f"REVISION={revision}",
                str(HERE / "workflows"),
            ],
            check=True,
            env=environment,
        )
    for image in (BASE_IMAGE, *WORKFLOW_IMAGES):
        kind_cluster.load_docker_image(image)
    return Kube(Path(kind_cluster.kubectl_path), Path(kind_cluster.kubeconfig_path))


@pytest.fixture(scope="session")
def treadle(cluster: Kube) -> Iterator[Kube]:
    """PostgreSQL, NATS, the chart (operator + CRDs + World Secret), migrations applied."""
    namespace = json.dumps(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    )
    cluster.kubectl("apply", "-f", "-", stdin=namespace)
    cluster.kubectl("apply", "-f", str(HERE / "manifests" / "world.yaml"))
    for server in ("postgres", "nats"):
        cluster.kubectl("rollout", "status", f"deployment/{server}", "--timeout=300s", timeout=330)
    cluster.helm(
        "upgrade",
        "--install",
        "treadle",
        str(ROOT / "charts" / "treadle"),
        "--wait",
        "--timeout",
        "5m",
        "--set",
        "image.repository=treadle",
        "--set",
        "image.tag=e2e",
        "--set",
        "logLevel=DEBUG",
        "--set",
        "world.create=true",
        "--set",
        f"world.secretName={WORLD_SECRET}",
        "--set",
        f"world.databaseUrl={DATABASE_URL}",
        "--set",
        f"world.natsUrl={NATS_URL}",
    )
    cluster.run_treadle("treadle-migrate", "migrate")
    yield cluster
    logs = cluster.kubectl("logs", "deployment/treadle-operator", "--tail=200")
    print(f"--- the operator's last log lines ---\n{logs}")
