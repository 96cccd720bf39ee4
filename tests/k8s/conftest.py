"""Fixtures for tests against a real Kubernetes API server (only tests under tests/k8s).

``kube`` (session): builds the control plane's binaries when the cache lacks
them (progress shown on the terminal; a failed build fails loudly), starts
etcd, kube-apiserver, kube-controller-manager and kube-scheduler on free
loopback ports with the repository's CRDs installed, and a process kubelet
serving the fake Node; yields a ``harness.Kube``. Nothing starts unless a test
asks for it. ``namespace`` gives a test a fresh namespace, deleted afterwards;
``kube_env`` puts KUBECONFIG in the test's environment (for kopf and kubectl);
``widget_crd`` installs a small CRD of the harness's own for API-semantics tests.
``real_node`` (session) adds a real node to that cluster (``node.py``: containerd,
runc and a kubelet built from the cached source tree, images built offline);
it builds what the cache lacks first, and skips, with the reason, where this
machine cannot run the container runtime. ``pod_node`` (session) decides where
the operator scenarios' worker pods run (``pod_node.py``): on the real node when
it starts, else on the process kubelet, the decision printed once.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes_asyncio.config import kube_config

from .cluster import (
    REPO,
    ControlPlane,
    ControlPlaneError,
    ensure_binaries,
    wait_established,
)
from .harness import WIDGET_CRD, Kube
from .kubelet import ProcessKubelet
from .node import NodeBinaries, NodeError, NodeUnavailable, RealNode, preflight
from .node_images import WORKFLOWS_IMAGE, NodeImages, ensure_node_parts
from .oci_image import ImageBuildError
from .pod_node import TAGS, PodNode, TagMaker, process_node, real_pod_node

# Pods import treadle from this checkout and write their logs unbuffered.
POD_ENV = {
    "PYTHONPATH": os.pathsep.join([str(REPO / "runtime"), str(REPO / "operator")]),
    "PYTHONUNBUFFERED": "1",
}
_namespaces = itertools.count(1)


# pytest-timeout's limit (pyproject: 300 s) covers a test's fixtures too, so the first
# test that sets up ``kube``, and the first that sets up ``real_node``, pay their builds
# on a machine whose cache is cold (control plane 8-10 min on 2 cores, more under load;
# real node about 5): those two get this limit instead.
COLD_TIMEOUT_SECONDS = 2400


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test against the API server runs in one xdist worker, so one session starts
    one control plane (the suite runs ``-n 2 --dist loadgroup``), in collection order:
    the first that asks for ``kube`` (``real_node``) builds it and gets the build's time."""
    here = os.path.dirname(__file__)
    builders = {"kube", "real_node", "pod_node"}
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.xdist_group("k8s"))
            builds = builders & set(getattr(item, "fixturenames", ()))
            if builds:
                item.add_marker(pytest.mark.timeout(COLD_TIMEOUT_SECONDS))
                builders -= builds


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


@pytest.fixture(scope="session")
def real_node(
    kube: Kube, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealNode]:
    """containerd + kubelet serving Node ``treadle-real-node`` (tainted: tests pin pods)."""
    progress = _terminal(request.config)
    reason = preflight()
    if reason is not None:
        progress(f"real node skipped: {reason}")
        pytest.skip(f"no real node here: {reason}")
    root = tmp_path_factory.mktemp("node")
    cache = kube.control_plane.binaries.cache
    began = time.monotonic()
    try:
        ensure_node_parts(cache, root / "build-node.log", progress)
        images = NodeImages(cache / "node", progress).all()
    except ImageBuildError as error:
        pytest.fail(str(error), pytrace=False)
    node = RealNode(
        root, NodeBinaries.in_cache(kube.control_plane.binaries), kube.server, kube.token,
        kube.kubeconfig, images, runs=cache / "node" / "runs",
    )  # fmt: skip
    try:
        node.start()
    except NodeUnavailable as error:
        node.stop()
        progress(f"real node skipped: {error}")
        pytest.skip(f"no real node here: {error}")
    except NodeError as error:
        node.stop()
        pytest.fail(str(error), pytrace=False)
    except BaseException:
        node.stop()
        raise
    timings = ", ".join(f"{k} {v:.1f} s" for k, v in node.timings.items())
    progress(f"real node up in {time.monotonic() - began:.1f} s ({timings}) at {root}")
    for stale in node.swept:
        progress(f"ended what a killed session's node left in {stale}")
    try:
        yield node
    finally:
        node.stop()


_DECISION = pytest.StashKey[str]()


@pytest.fixture(scope="session")
def pod_node(
    kube: Kube, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> PodNode:
    """Where the operator scenarios' worker pods run: the real node when it starts (its
    images of ``TAGS`` imported, any other tag made when first used), else the process
    kubelet, with the reason; printed."""
    progress = _terminal(request.config)
    shared = tmp_path_factory.mktemp("pod-shared")
    shared.chmod(0o755)  # the pods' user (10001) reads what tests leave there
    chosen: PodNode
    if os.environ.get("TREADLE_K8S_WORKER_PODS", "real") == "process":
        chosen = process_node(kube, shared, "TREADLE_K8S_WORKER_PODS=process")
    else:
        try:
            node: RealNode = request.getfixturevalue("real_node")
            workflows = next(i for i in node.images if i.name == WORKFLOWS_IMAGE)
            began = time.monotonic()
            images = NodeImages(kube.control_plane.binaries.cache / "node", progress)
            chosen = real_pod_node(kube, node, shared, TagMaker(images, workflows))
            progress(f"images of {', '.join(TAGS)} ready in {time.monotonic() - began:.1f} s")
        except (pytest.skip.Exception, pytest.fail.Exception) as outcome:
            chosen = process_node(kube, shared, f"the real node did not start: {outcome.msg}")
        except (ImageBuildError, NodeError) as error:
            chosen = process_node(kube, shared, f"the real node's images failed: {error}")
    progress(chosen.describe())
    request.config.stash[_DECISION] = chosen.describe()
    return chosen


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    decision = terminalreporter.config.stash.get(_DECISION, None)
    if decision is not None:
        terminalreporter.write_line(f"[k8s] {decision}")
