"""Where the operator scenarios' worker pods run: the real node, else the process kubelet.

The session fixture ``pod_node`` (conftest) makes the decision once and prints it
(``worker pods on: ...``): the real node (``node.py``: containerd, runc, a real
kubelet, real images) whenever it starts; otherwise the process kubelet
(``kubelet.py``), with the reason the real node could not start, and every
scenario still runs. ``TREADLE_K8S_WORKER_PODS=process`` chooses the process
kubelet on purpose.

``PodNode`` is what a ``Shop`` (``operator_env.py``) asks when it makes worker
pods, and what a test asks about them:

- ``worker_spec``: a WorkflowDeployment spec made to run on the node. On the real
  node: module ``/app/k8s_workflows.py`` (in the image), ``imagePullPolicy:
  Never`` always (a missing image is ``ErrImageNeverPull``, never a pull: loopback
  only), and ``template`` (below). On the process kubelet: the module's host path.
- ``template``: a ``spec.template`` with the real node's part merged in (host
  network, no service links, the node's taint tolerated and label selected, a
  short grace period, the pod's name in ``TREADLE_POD_NAME`` from the downward
  API, and ``shared`` mounted). Tests that patch ``spec.template`` pass it
  through this, so their patch keeps the workers on the node.
- ``image``: a short tag ("shop:4" is ``docker.io/library/shop:4`` to the runtime)
  made on the node: the workflows image plus a file ``/app/pod-image`` holding the
  tag, which ``k8s_workflows.py`` reports where the process kubelet's
  ``TREADLE_POD_IMAGE`` is unset. ``TAGS``, the ones most scenarios use, are built
  in one archive (cached by the workflows image's manifest) and imported as the
  session starts; any other short tag is built and imported the first time
  ``worker_spec`` or ``Shop.patch`` meets it. A name with a registry
  (``unpullable.invalid/...``) is meant to be missing and stays missing:
  ``image_pull_reasons`` are the waiting reasons each node gives.
- ``pod_log`` / ``logs_tail``: pod output from the node actually used.
- ``shared_file``: a file the test writes on the host and a worker pod reads, and
  the path the pod sees it at.
"""

from __future__ import annotations

import copy
import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .harness import Kube
from .node import REAL_NODE_NAME, REAL_NODE_TAINT, RealNode
from .node_images import WORKFLOWS_MODULE, ImageArchive, NodeImages

WORKFLOWS = Path(__file__).with_name("k8s_workflows.py")
# The tags imported as the session starts (most scenarios deploy shop:1 and roll out to
# shop:2); any other short tag is made when a scenario first uses it (PodNode.image).
TAGS = ("shop:1", "shop:2")
POD_IMAGE_FILE = "/app/pod-image"  # k8s_workflows.where() reads it on the real node
SHARED_VOLUME = "treadle-test-shared"
SHARED_PATH = "/shared"
# The process kubelet caps every grace period at 10 s; the same on the real node (the
# operator's default is 40 s: `treadle worker` finishes deliveries within --grace 30).
GRACE_SECONDS = 10
REAL_LABEL = {"treadle.dev/node": "real"}


@dataclass(frozen=True)
class SharedFile:
    host: Path  # where the test writes it
    pod: str  # where a worker pod reads it


@dataclass(frozen=True)
class TagMaker:
    """What makes a tag on the real node: the image builder and the workflows image."""

    images: NodeImages
    workflows: ImageArchive


@dataclass
class PodNode:
    kube: Kube
    real: RealNode | None
    why: str  # the node's description (real) or why the real node is not used
    shared: Path  # a host directory worker pods see (at SHARED_PATH on the real node)
    maker: TagMaker | None = None
    imported: set[str] = field(default_factory=set)  # the tags on the real node

    @property
    def is_real(self) -> bool:
        return self.real is not None

    @property
    def module(self) -> str:
        """The path worker pods load the workflows from."""
        return WORKFLOWS_MODULE if self.is_real else str(WORKFLOWS)

    @property
    def image_pull_reasons(self) -> tuple[str, ...]:
        """The waiting reasons a node gives a worker whose image it lacks (no registry here:
        the process kubelet plays a failed pull, the real kubelet never pulls)."""
        return ("ErrImageNeverPull",) if self.is_real else ("ErrImagePull", "ImagePullBackOff")

    def describe(self) -> str:
        where = f"real node {REAL_NODE_NAME}" if self.is_real else "the process kubelet"
        return f"worker pods on: {where} ({self.why})"

    # --- images ----------------------------------------------------------------------------

    def import_tags(self, tags: tuple[str, ...]) -> None:
        """Build (cached) and import ``tags`` on the real node, in one thin archive."""
        if self.real is None or self.maker is None:
            return
        wanted = tuple(tag for tag in tags if tag not in self.imported)
        if not wanted:
            return
        tagged = self.maker.images.tagged(self.maker.workflows, wanted, POD_IMAGE_FILE)
        self.real.ctr(["images", "import", str(tagged.path)], f"importing {tagged.name}")
        self.imported.update(wanted)

    def image(self, image: str) -> None:
        """Make ``image`` present on the real node if it is a short tag ("shop:4"); a name
        with a registry ("unpullable.invalid/x:1") is left missing, as a scenario means."""
        name, _, tag = image.rpartition(":")
        if self.is_real and name and tag and "/" not in name:
            self.import_tags((image,))

    # --- specs -----------------------------------------------------------------------------

    def worker_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        """A WorkflowDeployment ``spec`` made to run on this node (module, pulls, template,
        and its image made on the node)."""
        made = copy.deepcopy(spec)
        made.setdefault("module", self.module)
        if isinstance(made.get("image"), str):
            self.image(made["image"])
        if self.is_real:
            made["imagePullPolicy"] = "Never"
            made["template"] = self.template(made.get("template"))
        return made

    def template(self, template: dict[str, Any] | None) -> dict[str, Any] | None:
        """``template`` with the real node's part merged in (unchanged on the process
        kubelet). Idempotent: what is there already is not added twice."""
        if not self.is_real:
            return template
        made: dict[str, Any] = copy.deepcopy(template) if template else {}
        spec: dict[str, Any] = dict(made.get("spec") or {})
        made["spec"] = spec
        # Loopback only: the pods reach the API server, PostgreSQL and NATS on 127.0.0.1.
        spec["hostNetwork"] = True
        spec["enableServiceLinks"] = False
        if spec.get("terminationGracePeriodSeconds") is None:
            spec["terminationGracePeriodSeconds"] = GRACE_SECONDS
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **REAL_LABEL}
        toleration = {**REAL_NODE_TAINT, "operator": "Exists"}
        tolerations = list(spec.get("tolerations") or [])
        spec["tolerations"] = tolerations + ([] if toleration in tolerations else [toleration])
        volumes = list(spec.get("volumes") or [])
        if all(v.get("name") != SHARED_VOLUME for v in volumes):
            host_path = {"path": str(self.shared), "type": "Directory"}
            volumes.append({"name": SHARED_VOLUME, "hostPath": host_path})
        spec["volumes"] = volumes
        containers = list(spec.get("containers") or [])
        if all(c.get("name") != "worker" for c in containers):
            containers.insert(0, {"name": "worker"})
        for container in containers:
            if container.get("name") != "worker":
                continue
            env = list(container.get("env") or [])
            if all(e.get("name") != "TREADLE_POD_NAME" for e in env):
                field = {"fieldRef": {"fieldPath": "metadata.name"}}
                env.append({"name": "TREADLE_POD_NAME", "valueFrom": field})
            container["env"] = env
            mounts = list(container.get("volumeMounts") or [])
            if all(m.get("name") != SHARED_VOLUME for m in mounts):
                mounts.append({"name": SHARED_VOLUME, "mountPath": SHARED_PATH, "readOnly": True})
            container["volumeMounts"] = mounts
        spec["containers"] = containers
        return made

    def shared_file(self, name: str) -> SharedFile:
        host = self.shared / name
        return SharedFile(host, f"{SHARED_PATH}/{name}" if self.is_real else str(host))

    # --- what ran --------------------------------------------------------------------------

    def pod_log(self, name: str, namespace: str) -> str:
        if self.real is not None:
            return self.real.pod_log(name, namespace)
        return self.kube.pod_log(name, namespace) + self.kube.pod_log(name, namespace, "stderr")

    def logs_tail(self, namespace: str, limit: int = 2000) -> str:
        """The end of each pod's output in ``namespace``, from the node that ran it."""
        if self.real is None:
            return self.kube.logs_tail(namespace, limit)
        parts = []
        for pod in self.kube.pods(namespace):
            name = str(pod["metadata"]["name"])  # type: ignore[index]
            try:
                text = self.real.pod_log(name, namespace)
            except Exception as error:
                text = f"(no log: {error})"
            parts.append(f"--- pod {name} output (tail):\n{text[-limit:]}")
        return "\n".join(parts)


def api_port(kube: Kube) -> int:
    port = urllib.parse.urlsplit(kube.server).port
    assert port is not None
    return port


def process_node(kube: Kube, shared: Path, why: str) -> PodNode:
    return PodNode(kube, None, why, shared)


def real_pod_node(kube: Kube, node: RealNode, shared: Path, maker: TagMaker) -> PodNode:
    info = (node.rest.get(f"/api/v1/nodes/{node.node_name}").get("status") or {}).get(
        "nodeInfo"
    ) or {}
    runtime = str(info.get("containerRuntimeVersion", "?")).replace("://", " ")
    why = f"{runtime}, kubelet {info.get('kubeletVersion', '?')}"
    shared.mkdir(parents=True, exist_ok=True)
    os.chmod(shared, 0o755)
    made = PodNode(kube, node, why, shared, maker)
    made.import_tags(TAGS)
    return made
