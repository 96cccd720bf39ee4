"""Fixtures for tests against a real Kubernetes API server (only tests under tests/k8s).

``kube`` (session): builds the control plane's binaries when the cache lacks
them (progress shown on the terminal; a failed build fails loudly), starts
etcd, kube-apiserver, kube-controller-manager and kube-scheduler on free
loopback ports with the repository's CRDs installed, and a process kubelet
serving the fake Node; yields a ``harness.Kube``. Nothing starts unless a test
asks for it. ``namespace`` gives a test a fresh namespace, deleted afterwards;
``kube_env`` puts KUBECONFIG in the test's environment (for kopf and kubectl);
``widget_crd`` installs a small CRD of the harness's own for API-semantics tests.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes_asyncio.config import kube_config

from .cluster import REPO, ControlPlane, ControlPlaneError, ensure_binaries, wait_established
from .harness import WIDGET_CRD, Kube
from .kubelet import ProcessKubelet

# Pods import treadle from this checkout and write their logs unbuffered.
POD_ENV = {
    "PYTHONPATH": os.pathsep.join([str(REPO / "runtime"), str(REPO / "operator")]),
    "PYTHONUNBUFFERED": "1",
}
_namespaces = itertools.count(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test against the API server runs in one xdist worker, so one session starts
    one control plane (the suite runs ``-n 2 --dist loadgroup``)."""
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.xdist_group("k8s"))


def _terminal(config: pytest.Config) -> Callable[[str], None]:
    """Writes a line to the terminal even while pytest captures output."""
    reporter = config.pluginmanager.getplugin("terminalreporter")
    capture = config.pluginmanager.getplugin("capturemanager")

    def write(line: str) -> None:
        if reporter is None or capture is None:
            print(line)
            return
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"[k8s] {line}")

    return write


@pytest.fixture(scope="session")
def kube(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Kube]:
    progress = _terminal(request.config)
    root = tmp_path_factory.mktemp("k8s")
    began = time.monotonic()
    try:
        binaries = ensure_binaries(root / "build.log", progress)
        control_plane = ControlPlane(root / "cluster", binaries).__enter__()
    except ControlPlaneError as error:
        pytest.fail(str(error), pytrace=False)
    kubelet = ProcessKubelet(
        control_plane.server, control_plane.token, root / "pods", extra_env=POD_ENV
    )
    try:
        kubelet.start()
        timings = ", ".join(f"{k} {v:.1f} s" for k, v in control_plane.timings.items())
        progress(f"control plane up in {time.monotonic() - began:.1f} s ({timings}) at {root}")
        yield Kube(control_plane, kubelet)
    finally:
        kubelet.stop()
        control_plane.stop()


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test; deleted (not awaited) afterwards."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{stem}-{next(_namespaces)}"
    kube.rest.create("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    kube.rest.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
def kube_env(kube: Kube, monkeypatch: pytest.MonkeyPatch) -> Kube:
    """KUBECONFIG points at the test cluster for this test (kopf's login reads it).

    kubernetes_asyncio reads $KUBECONFIG once, when imported (here, at collection),
    and kopf logs in through it: its default location is patched as well.
    """
    for key, value in kube.environ().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kube.kubeconfig))
    return kube


@pytest.fixture(scope="session")
def widget_crd(kube: Kube) -> str:
    """The harness's Widget CRD (group harness.test.treadle.dev), Established; its name.

    Installed once and kept: deleting a CRD takes a while, and tests use namespaces.
    """
    name = str(WIDGET_CRD["metadata"]["name"])
    kube.rest.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", WIDGET_CRD)
    wait_established(kube.rest, name)
    return name
