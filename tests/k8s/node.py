"""A real node for the test cluster: containerd + runc + the kubelet, on loopback only.

``RealNode`` starts, beside the control plane (``cluster.py``):

- containerd 1.6 (Debian's, unpacked by ``build_node.sh`` into the cache prefix)
  with its own root, state and socket under the run directory, runc's state
  there too, the CRI plugin's sandbox image our static pause, and a CNI
  configuration whose only plugin is ``loopback`` (the CRI plugin reports its
  network ready only once it has loaded a configuration; pods of these tests
  all use ``hostNetwork: true``, and any other pod would get a loopback
  interface and nothing else: no bridge, no address, no iptables change);
- the images of ``node_images`` (pause, Debian + Python, treadle, the workflows
  image), imported with ``ctr images import`` into the ``k8s.io`` namespace;
  pods use them with ``imagePullPolicy: Never``;
- the kubelet built from the cached source tree, with a config file (cgroupfs
  driver under a cgroup root of its own, swap allowed, serving and healthz on
  127.0.0.1, no iptables chains, eviction and image GC effectively off), the
  control plane's token kubeconfig, registering Node ``treadle-real-node`` with
  the taint ``treadle.dev/real-node:NoSchedule`` (so the scheduler keeps the
  process kubelet's pods off it; tests pin ``nodeName`` and tolerate it);

then waits for the Node to be Ready. containerd runs in a mount namespace of
its own, which the kubelet joins, where ``/var/log/pods`` and
``/var/log/containers`` are the run's directories (see ``_start_containerd``);
pod logs are read on the host from those files (the API server cannot reach a
kubelet whose node IP is loopback). ``stop`` stops the kubelet, kills and
deletes every container the runtime still has, stops containerd, unmounts what
they left under the run directory and removes the cgroup root; what a killed
session left is ended by the next node's start (``node_sweep``).

Failures are one line naming the log to read: ``NodeUnavailable`` (this
machine cannot run the runtime: not root, no cgroup v1, no overlayfs, or
containerd would not start; the tests skip with it) and ``NodeError`` (an image
import failed, the kubelet exited or never made the Node Ready: tests fail).

Quirks of these machines, handled here:

1. Root lacks ``CAP_SYS_RESOURCE``, so runc cannot set a negative
   ``oom_score_adj``, and every pod sandbox asks for -998 (runc then fails with
   "can't get final child's PID from pipe"). The CRI plugin's
   ``restrict_oom_score_adj`` clamps every container's value to containerd's
   own (0 here), which is what a runc wrapper would do, without one.
2. The kubelet refuses a loopback ``--node-ip`` for the Node's addresses; it
   still registers and runs pods (its log says so; nothing depends on them).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import node_sweep
from .cluster import Binaries
from .node_images import PAUSE_IMAGE, ImageArchive
from .processes import die_with_parent, free_port
from .rest import ApiError, Rest

REAL_NODE_NAME = "treadle-real-node"
REAL_NODE_TAINT = {"key": "treadle.dev/real-node", "effect": "NoSchedule"}
# Where kubelet 1.20 has containerd write pod logs (fixed, not configurable), and its
# legacy symlinks: each node bind-mounts directories of its own there, in a mount
# namespace of its own (see ``_start_containerd``).
HOST_LOG_DIRS = (Path("/var/log/pods"), Path("/var/log/containers"))
# sh -c SCRIPT pod-logs container-logs argv... ($0 $1 "$@"): binds the two, execs argv.
PRIVATE_LOGS = (
    'set -e; mount --bind "$0" /var/log/pods; mount --bind "$1" /var/log/containers; '
    'shift; exec "$@"'
)
RUNTIME_SECONDS = 30.0
IMPORT_SECONDS = 120.0
READY_SECONDS = 120.0
STOP_SECONDS = 15.0
POLL_SECONDS = 0.2
CRI_LOG_LINE = re.compile(r"^\S+ (stdout|stderr) [FP] ?(.*)$")


class NodeUnavailable(RuntimeError):
    """This machine cannot run the container runtime; real-node tests skip with this."""


class NodeError(RuntimeError):
    """The real node failed after its runtime started; the message names the log."""


@dataclass(frozen=True)
class NodeBinaries:
    kubelet: Path
    containerd: Path
    ctr: Path
    runc: Path
    cni_bin: Path

    @classmethod
    def in_cache(cls, binaries: Binaries) -> NodeBinaries:
        prefix = binaries.cache / "prefix"
        return cls(
            kubelet=binaries.apiserver.parent / "kubelet",
            containerd=prefix / "usr" / "bin" / "containerd",
            ctr=prefix / "usr" / "bin" / "ctr",
            runc=prefix / "usr" / "sbin" / "runc",
            cni_bin=prefix / "usr" / "lib" / "cni",
        )

    def present(self) -> bool:
        paths = (self.kubelet, self.containerd, self.ctr, self.runc, self.cni_bin / "loopback")
        return all(path.is_file() and os.access(path, os.X_OK) for path in paths)


def preflight() -> str | None:
    """Why this machine cannot run containers, or None when it looks able to."""
    if os.geteuid() != 0:
        return "the real node needs root (containerd, runc and the kubelet run as root)"
    if not Path("/sys/fs/cgroup/memory/cgroup.procs").exists():
        return "the real node needs cgroup v1 (kubelet 1.20): no /sys/fs/cgroup/memory"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the real node needs overlayfs (containerd's snapshotter): not in /proc/filesystems"
    if os.environ.get("TREADLE_K8S_REAL_NODE", "1") == "0":
        return "TREADLE_K8S_REAL_NODE=0"
    return None


@dataclass
class _Process:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class RealNode:
    """containerd + kubelet serving ``REAL_NODE_NAME`` for the control plane at ``server``."""

    root: Path
    binaries: NodeBinaries
    server: str
    token: str
    kubeconfig: Path
    images: list[ImageArchive]
    node_name: str = REAL_NODE_NAME
    ready_seconds: float = READY_SECONDS
    # Where live nodes register, so a later one can end what a killed session left.
    runs: Path | None = None
    processes: list[_Process] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rest = Rest(self.server, self.token)
        self.logs = self.root / "logs"
        self.socket = self.root / "containerd.sock"
        # A cgroup root of this node's own, so two test sessions' kubelets never share one.
        self.cgroup_root = f"/treadle-{secrets.token_hex(4)}"
        self.pod_logs = self.root / "pod-logs"
        self._entry: Path | None = None
        self.swept: list[str] = []

    # --- start and stop --------------------------------------------------------------------

    def start(self) -> None:
        began = time.monotonic()
        self.start_runtime()
        self._make_cgroup_root()
        self._start_kubelet()
        self._wait_ready()
        self.timings["node Ready"] = time.monotonic() - began

    def start_runtime(self) -> None:
        """The sweep of dead runs, containerd, and the images imported (no kubelet yet)."""
        began = time.monotonic()
        self.logs.mkdir(parents=True, exist_ok=True)
        if self.runs is not None:
            self.swept = node_sweep.sweep(self.runs, self.binaries.runc, self._cgroup_hierarchies())
        self._start_containerd()
        if self.runs is not None:
            containerd = next(p for p in self.processes if p.name == "containerd")
            entry = node_sweep.RunEntry(str(self.root), containerd.process.pid, str(self.socket),
                                        self.cgroup_root)  # fmt: skip
            self._entry = node_sweep.register(self.runs, self.cgroup_root.lstrip("/"), entry)
        self.timings["containerd up"] = time.monotonic() - began
        for image in self.images:
            self.ctr(["images", "import", str(image.path)], f"importing {image.name}",
                     timeout=IMPORT_SECONDS)  # fmt: skip
        self.timings["images imported"] = time.monotonic() - began

    def stop(self) -> None:
        """kubelet, then every container left, then containerd; mounts and cgroups after."""
        for process in reversed(self.processes):
            if process.name == "kubelet":
                process.stop()
        with contextlib.suppress(NodeError, OSError):
            self._remove_containers()
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        self._unmount_under(self.root)
        self._remove_cgroup_root()
        # The snapshots are a few hundred MB a run: pytest keeps its last tmp directories.
        shutil.rmtree(self.root / "containerd", ignore_errors=True)
        if self._entry is not None:
            self._entry.unlink(missing_ok=True)

    # --- containerd ------------------------------------------------------------------------

    def _containerd_config(self) -> Path:
        cni_conf = self.root / "cni"
        cni_conf.mkdir(parents=True, exist_ok=True)
        loopback = {"cniVersion": "0.4.0", "name": "treadle-loopback",
                    "plugins": [{"type": "loopback"}]}  # fmt: skip
        (cni_conf / "10-loopback.conflist").write_text(json.dumps(loopback))
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        runc = f"{cri}.containerd.runtimes.runc"
        config = f"""version = 2
root = "{self.root / "containerd"}"
state = "{self.root / "containerd-state"}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[metrics]
  address = ""
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # Quirk 1 (see the module's docstring): no CAP_SYS_RESOURCE, so no negative oom_score_adj.
  restrict_oom_score_adj = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{runc}]
  runtime_type = "io.containerd.runc.v2"
[{runc}.options]
  BinaryName = "{self.binaries.runc}"
  Root = "{self.root / "runc"}"
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "{self.binaries.cni_bin}"
  conf_dir = "{cni_conf}"
"""
        path = self.root / "containerd.toml"
        path.write_text(config)
        return path

    def _start_containerd(self) -> None:
        config = self._containerd_config()
        # The kubelet's container GC deletes every directory of /var/log/pods whose pod
        # it does not know: two test sessions' nodes on one machine would delete each
        # other's logs. So containerd runs in a mount namespace of its own (the kubelet
        # joins it) where /var/log/pods and /var/log/containers are this node's
        # directories; the pods' and volumes' mounts live and die with it too.
        for directory in HOST_LOG_DIRS:
            directory.mkdir(parents=True, exist_ok=True)
        (self.root / "container-logs").mkdir(exist_ok=True)
        self.pod_logs.mkdir(exist_ok=True)
        private = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                   PRIVATE_LOGS, str(self.pod_logs), str(self.root / "container-logs")]  # fmt: skip
        process = self._spawn(
            "containerd", [*private, str(self.binaries.containerd), "--config", str(config)]
        )
        deadline = time.monotonic() + RUNTIME_SECONDS
        while True:
            if process.process.poll() is not None:
                raise NodeUnavailable(
                    f"containerd exited with {process.process.returncode} at start; "
                    f"see {process.log}"
                )
            if self.socket.exists() and self._ctr_ok(["version"]):
                return
            if time.monotonic() > deadline:
                raise NodeUnavailable(
                    f"containerd did not answer within {RUNTIME_SECONDS:.0f} s; see {process.log}"
                )
            time.sleep(POLL_SECONDS)

    def _ctr_argv(self, args: list[str]) -> list[str]:
        return [str(self.binaries.ctr), "--address", str(self.socket), "--namespace", "k8s.io",
                *args]  # fmt: skip

    def _ctr_ok(self, args: list[str]) -> bool:
        done = subprocess.run(self._ctr_argv(args), capture_output=True, timeout=10, check=False)
        return done.returncode == 0

    def ctr(self, args: list[str], what: str, timeout: float = 30.0) -> str:
        """Runs ``ctr`` against this node's containerd; its output (``NodeError`` if it fails)."""
        log = self.logs / "ctr.log"
        try:
            done = subprocess.run(
                self._ctr_argv(args), capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise NodeError(f"{what}: ctr took over {timeout:.0f} s; see {log}") from None
        with log.open("a") as sink:
            sink.write(f"$ ctr {' '.join(args)}\n{done.stdout}{done.stderr}")
        if done.returncode != 0:
            message = done.stderr.strip().splitlines()[-1:] or [""]
            raise NodeError(f"{what} failed: {message[0]} (see {log})")
        return done.stdout

    def _remove_containers(self) -> None:
        if not self.socket.exists():
            return
        tasks = [line.split()[0] for line in self.ctr(["tasks", "ls", "-q"], "tasks").split()]
        for task in tasks:
            with contextlib.suppress(NodeError):
                self.ctr(["tasks", "kill", "--signal", "SIGKILL", task], f"killing {task}")
        for task in tasks:
            with contextlib.suppress(NodeError):
                self.ctr(["tasks", "delete", "--force", task], f"deleting task {task}")
        for container in self.ctr(["containers", "ls", "-q"], "containers").split():
            with contextlib.suppress(NodeError):
                self.ctr(["containers", "delete", container], f"deleting {container}")

    # --- the kubelet -----------------------------------------------------------------------

    def _kubelet_config(self) -> Path:
        """cgroupfs, swap allowed, loopback listeners, nothing evicted or garbage-collected."""
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "failSwapOn": False,
            "address": "127.0.0.1",
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            # No iptables changes: no KUBE-MARK-* chains.
            "makeIPTablesUtilChains": False,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "volumePluginDir": str(self.root / "volume-plugins"),
            "resolvConf": "/etc/resolv.conf",
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "5s",
            "fileCheckFrequency": "5s",
        }  # fmt: skip
        path = self.root / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def _start_kubelet(self) -> None:
        config = self._kubelet_config()
        containerd = next(p for p in self.processes if p.name == "containerd")
        # Into containerd's mount namespace (its private /var/log/pods, see above).
        join = ["nsenter", f"--target={containerd.process.pid}", "--mount", "--"]
        self._spawn(
            "kubelet",
            [*join, str(self.binaries.kubelet),
             f"--config={config}", f"--kubeconfig={self.kubeconfig}",
             "--container-runtime=remote", f"--container-runtime-endpoint=unix://{self.socket}",
             f"--root-dir={self.root / 'kubelet'}", f"--cert-dir={self.root / 'kubelet-pki'}",
             f"--hostname-override={self.node_name}",
             # Quirk 2: refused for the Node's addresses (logged), the node still works.
             "--node-ip=127.0.0.1",
             "--node-labels=treadle.dev/node=real", "--v=2",
             f"--register-with-taints={REAL_NODE_TAINT['key']}=:{REAL_NODE_TAINT['effect']}"],
        )  # fmt: skip

    def _make_cgroup_root(self) -> None:
        for hierarchy in self._cgroup_hierarchies():
            (hierarchy / self.cgroup_root.lstrip("/")).mkdir(exist_ok=True)

    def _remove_cgroup_root(self) -> None:
        for hierarchy in self._cgroup_hierarchies():
            top = hierarchy / self.cgroup_root.lstrip("/")
            if not top.is_dir():
                continue
            # Deepest first: a cgroup directory goes with rmdir once its children have.
            for directory in sorted((p for p in top.rglob("*") if p.is_dir()), reverse=True):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()

    @staticmethod
    def _cgroup_hierarchies() -> list[Path]:
        base = Path("/sys/fs/cgroup")
        return [p for p in sorted(base.iterdir()) if (p / "cgroup.procs").exists()
                and p.name != "unified" and not p.is_symlink()]  # fmt: skip

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_seconds
        kubelet = next(p for p in self.processes if p.name == "kubelet")
        last = "not registered"
        while True:
            for process in self.processes:
                if process.process.poll() is not None:
                    raise NodeError(
                        f"{process.name} exited with {process.process.returncode}; "
                        f"see {process.log}"
                    )
            node = self.rest.find(f"/api/v1/nodes/{self.node_name}")
            if node is not None:
                conditions = (node.get("status") or {}).get("conditions") or []
                ready = next((c for c in conditions if c["type"] == "Ready"), None)
                if ready is not None and ready["status"] == "True":
                    # Admission tainted the new Node not-ready, and no node-lifecycle
                    # controller runs to lift it: the harness plays that controller.
                    self.rest.patch(f"/api/v1/nodes/{self.node_name}",
                                    {"spec": {"taints": [REAL_NODE_TAINT]}})  # fmt: skip
                    return
                if ready is not None:
                    last = f"{ready.get('reason')}: {ready.get('message')}"
            if time.monotonic() > deadline:
                raise NodeError(
                    f"the kubelet did not make Node {self.node_name} Ready within "
                    f"{self.ready_seconds:.0f} s (last: {last}); see {kubelet.log}"
                )
            time.sleep(POLL_SECONDS)

    # --- helpers ---------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> _Process:
        log = self.logs / f"{name}.log"
        env = dict(os.environ)
        # containerd finds its shim by PATH; the shim finds nothing else there (BinaryName).
        env["PATH"] = f"{self.binaries.containerd.parent}:{env.get('PATH', '/usr/bin:/bin')}"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                cwd=self.root, env=env, start_new_session=True, preexec_fn=die_with_parent,
            )  # fmt: skip
        started = _Process(name, process, log)
        self.processes.append(started)
        return started

    @staticmethod
    def _unmount_under(root: Path) -> None:
        prefix = str(root.resolve()) + "/"
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)

    # --- what tests read -------------------------------------------------------------------

    def pod_log(self, name: str, namespace: str = "default", container: str = "") -> str:
        """What the Pod's container (the first, by default) wrote, all its runs, from the
        runtime's log files on the host (CRI format, one line a record)."""
        pod = self.rest.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        uid = pod["metadata"]["uid"]
        container = container or pod["spec"]["containers"][0]["name"]
        directory = self.pod_logs / f"{namespace}_{name}_{uid}" / container
        lines: list[str] = []
        paths = sorted(
            directory.glob("*.log"), key=lambda p: int(p.stem) if p.stem.isdigit() else 0
        )
        for path in paths:
            for record in path.read_text(errors="replace").splitlines():
                match = CRI_LOG_LINE.match(record)
                lines.append(match.group(2) if match else record)
        return "\n".join(lines) + ("\n" if lines else "")


def real_pod(name: str, image: str, command: list[str], **spec: Any) -> dict[str, Any]:
    """A Pod for the real node: pinned to it, host network, no service links, never pulled."""
    container: dict[str, Any] = {"name": "main", "image": image, "command": command,
                                 "imagePullPolicy": "Never"}  # fmt: skip
    container.update(spec.pop("container", {}))
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": REAL_NODE_NAME,
            "tolerations": [{**REAL_NODE_TAINT, "operator": "Exists"}],
            "hostNetwork": True,
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [container],
        },
    }
    body["spec"].update(spec)
    return body


def pod_phase(rest: Rest, name: str, namespace: str) -> str | None:
    try:
        return str((rest.get(f"/api/v1/namespaces/{namespace}/pods/{name}").get("status") or {})
                   .get("phase"))  # fmt: skip
    except ApiError as error:
        if error.status == 404:
            return None
        raise


SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def api_ca_configmap(control_plane_root: Path, name: str = "treadle-test-api-ca") -> dict[str, Any]:
    """A ConfigMap with the API server's CA (its self-signed cert-dir bundle) as ``ca.crt``."""
    bundle = (control_plane_root / "certs" / "apiserver.crt").read_text()
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
            "data": {"ca.crt": bundle}}  # fmt: skip


def in_cluster_on_real_node(
    pod_spec: dict[str, Any], api_port: int, ca_configmap: str = "treadle-test-api-ca"
) -> dict[str, Any]:
    """``pod_spec`` changed to run in-cluster on the real node, loopback only.

    Host network, no service links, the real node's taint tolerated and its label
    selected, images never pulled, the API server given as 127.0.0.1 and its port
    (never the ``kubernetes`` Service's cluster IP: no kube-proxy here), probes on
    127.0.0.1, and the service-account volume the ServiceAccount admission plugin
    would add in newer releases (it is off in this control plane): a bound token
    by TokenRequest, the API server's CA and the namespace, where in-cluster
    clients read them.
    """
    spec: dict[str, Any] = json.loads(json.dumps(pod_spec))
    spec.update(hostNetwork=True, enableServiceLinks=False, automountServiceAccountToken=False)
    spec["nodeSelector"] = {**spec.get("nodeSelector", {}), "treadle.dev/node": "real"}
    spec["tolerations"] = [*spec.get("tolerations", []), {**REAL_NODE_TAINT, "operator": "Exists"}]
    projected = {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
        {"configMap": {"name": ca_configmap, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
                                    "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
    ]}  # fmt: skip
    spec["volumes"] = [*spec.get("volumes", []), {"name": "kube-api", "projected": projected}]
    api_env = [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
               {"name": "KUBERNETES_SERVICE_PORT", "value": str(api_port)}]  # fmt: skip
    for container in spec["containers"]:
        container["imagePullPolicy"] = "Never"
        names = {"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}
        env = [e for e in container.get("env", []) if e["name"] not in names]
        container["env"] = [*env, *api_env]
        mount = {"name": "kube-api", "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": True}
        container["volumeMounts"] = [*container.get("volumeMounts", []), mount]
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if "httpGet" in container.get(probe, {}):
                container[probe]["httpGet"]["host"] = "127.0.0.1"
    return spec
