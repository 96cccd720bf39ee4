"""A real Kubernetes 1.20 control plane on loopback: etcd, API server, controllers, scheduler.

``ensure_binaries`` runs ``build_control_plane.sh`` when the per-machine cache
lacks the binaries (a failed build raises with the log's tail). ``ControlPlane``
starts etcd and kube-apiserver on free loopback ports in a fresh directory with
a token kubeconfig, installs the repository's ``crds/*.yaml`` and waits for
them to be Established *before* the controller-manager starts (its garbage
collector would otherwise only see the custom resources at its next discovery
resync, about 30 s later), creates the fake Node the process kubelet serves,
then starts kube-controller-manager and kube-scheduler with no listeners
(``--port=0 --secure-port=0``). ``stop`` ends them in reverse order: controllers,
API server (before etcd, or it hangs), etcd. Used by ``conftest.py``.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .processes import die_with_parent, free_port, tail
from .rest import ApiError, Rest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD_SCRIPT = HERE / "build_control_plane.sh"
NODE_NAME = "treadle-node"
NODE_RESOURCES = {"cpu": "64", "memory": "256Gi", "pods": "500", "ephemeral-storage": "1Ti"}
READY_SECONDS = 60.0
STOP_SECONDS = 10.0
LOG_TAIL = 3000


class ControlPlaneError(RuntimeError):
    """The control plane could not be built or started; the message carries the log tail."""


@dataclass(frozen=True)
class Binaries:
    apiserver: Path
    controller_manager: Path
    scheduler: Path
    etcd: Path
    cache: Path

    @classmethod
    def in_cache(cls) -> Binaries:
        """Where ``build_control_plane.sh`` puts them (``TREADLE_K8S_CACHE`` overrides)."""
        default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        cache = Path(os.environ.get("TREADLE_K8S_CACHE") or default / "treadle-k8s-1.20")
        bin_dir = cache / "kubernetes-1.20.2" / "_output" / "bin"
        return cls(
            apiserver=bin_dir / "kube-apiserver",
            controller_manager=bin_dir / "kube-controller-manager",
            scheduler=bin_dir / "kube-scheduler",
            etcd=cache / "prefix" / "usr" / "bin" / "etcd",
            cache=cache,
        )

    def present(self) -> bool:
        paths = (self.apiserver, self.controller_manager, self.scheduler, self.etcd)
        return all(path.is_file() and os.access(path, os.X_OK) for path in paths)


def ensure_binaries(log_path: Path, progress: Callable[[str], None]) -> Binaries:
    """The cached binaries, built first when missing; each build line goes to ``progress``."""
    binaries = Binaries.in_cache()
    if binaries.present():
        return binaries
    binaries.cache.mkdir(parents=True, exist_ok=True)
    with (binaries.cache / "build.lock").open("w") as lock:
        # Two test sessions must not build into one cache at once: the second waits.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binaries.present():
            return binaries
        return _build(binaries, log_path, progress)


def _build(binaries: Binaries, log_path: Path, progress: Callable[[str], None]) -> Binaries:
    progress(f"building the Kubernetes 1.20 control plane (about 10 min cold), log: {log_path}")
    with (
        log_path.open("w") as log,
        subprocess.Popen(
            ["bash", str(BUILD_SCRIPT)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
        ) as build,
    ):
        assert build.stdout is not None
        for line in build.stdout:
            log.write(line)
            progress(line.rstrip())
    if build.returncode != 0 or not binaries.present():
        raise ControlPlaneError(
            f"{BUILD_SCRIPT.name} failed (exit {build.returncode}); last lines of {log_path}:\n"
            + tail(log_path, LOG_TAIL)
        )
    return binaries


@dataclass
class Component:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def failure(self, what: str) -> ControlPlaneError:
        return ControlPlaneError(
            f"{self.name} {what}; end of {self.log}:\n{tail(self.log, LOG_TAIL)}"
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler under ``root``."""

    def __init__(self, root: Path, binaries: Binaries, crds_dir: Path = REPO / "crds") -> None:
        self.root = root
        self.binaries = binaries
        self.crds_dir = crds_dir
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = root / "kubeconfig"
        self.rest = Rest(self.server, self.token)
        self.components: list[Component] = []
        self.timings: dict[str, float] = {}

    def __enter__(self) -> ControlPlane:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        began = time.monotonic()
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        self._write_credentials()
        etcd_url = self._start_etcd()
        self._start_apiserver(etcd_url)
        self._wait_ready()
        self.timings["apiserver ready"] = time.monotonic() - began
        self.install_crds()
        self._create_node()
        kubeconfig = f"--kubeconfig={self.kubeconfig}"
        self._spawn(
            "kube-controller-manager",
            [str(self.binaries.controller_manager), kubeconfig, "--leader-elect=false",
             "--controllers=*,-serviceaccount-token,-nodelifecycle",
             "--use-service-account-credentials=false", "--bind-address=127.0.0.1",
             "--secure-port=0", "--port=0"],
        )  # fmt: skip
        self._spawn(
            "kube-scheduler",
            [str(self.binaries.scheduler), kubeconfig, "--leader-elect=false",
             "--bind-address=127.0.0.1", "--secure-port=0", "--port=0"],
        )  # fmt: skip
        # The service-account controller creating ``default`` shows the controllers run.
        self._wait("kube-controller-manager", "/api/v1/namespaces/default/serviceaccounts/default")
        self.timings["control plane ready"] = time.monotonic() - began

    def stop(self) -> None:
        """Controllers first, then the API server (before etcd, or it hangs), then etcd."""
        for component in reversed(self.components):
            component.stop()
        self.components.clear()
        shutil.rmtree(self.root / "etcd", ignore_errors=True)

    def install_crds(self) -> list[str]:
        """Creates every CRD in ``crds_dir/**/*.yaml`` and waits until each is Established."""
        names = []
        for path in sorted(self.crds_dir.rglob("*.yaml")) if self.crds_dir.is_dir() else []:
            for document in yaml.safe_load_all(path.read_text()):
                if not document:
                    continue
                if document.get("kind") != "CustomResourceDefinition":
                    raise ControlPlaneError(f"{path}: a {document.get('kind')} is not a CRD")
                self.rest.create(
                    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", document
                )
                names.append(document["metadata"]["name"])
        for name in names:
            wait_established(self.rest, name)
        return names

    def _write_credentials(self) -> None:
        (self.root / "tokens.csv").write_text(f'{self.token},admin,admin-uid,"system:masters"\n')
        key, public = self.root / "sa.key", self.root / "sa.pub"
        for argv in (
            ["openssl", "genrsa", "-out", str(key), "2048"],
            ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(public)],
        ):
            subprocess.run(argv, check=True, capture_output=True)
        cluster = {"server": self.server, "insecure-skip-tls-verify": True}
        context = {"cluster": "treadle-test", "user": "admin", "namespace": "default"}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "treadle-test", "cluster": cluster}],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "treadle-test", "context": context}],
            "current-context": "treadle-test",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))

    def _start_etcd(self) -> str:
        client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
        self._spawn(
            "etcd",
            [str(self.binaries.etcd), "--data-dir", str(self.root / "etcd"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"default={peer}"],
        )  # fmt: skip
        return client

    def _start_apiserver(self, etcd_url: str) -> None:
        root = self.root
        self._spawn(
            "kube-apiserver",
            [str(self.binaries.apiserver), f"--etcd-servers={etcd_url}",
             "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
             f"--secure-port={self.port}", "--insecure-port=0", f"--cert-dir={root / 'certs'}",
             f"--token-auth-file={root / 'tokens.csv'}", "--authorization-mode=RBAC",
             "--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true",
             "--service-account-issuer=https://kubernetes.default.svc",
             f"--service-account-key-file={root / 'sa.pub'}",
             f"--service-account-signing-key-file={root / 'sa.key'}",
             "--disable-admission-plugins=ServiceAccount",
             # OpenShift's default: blockOwnerDeletion needs update on the owner's finalizers.
             "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
             f"--audit-policy-file={self._audit_policy()}", f"--audit-log-path={self.audit_log}",
             "--audit-log-maxsize=200", "--audit-log-maxbackup=1"],
        )  # fmt: skip

    @property
    def audit_log(self) -> Path:
        """The API server's audit log: every request of a service account (the operator runs
        as the chart's), one JSON line each at ResponseComplete (tests count its calls)."""
        return self.root / "logs" / "audit.log"

    def _audit_policy(self) -> Path:
        path = self.root / "audit-policy.yaml"
        policy = {
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [{"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
                      {"level": "None"}],
        }  # fmt: skip
        path.write_text(yaml.safe_dump(policy))
        return path

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = self.root / "logs" / f"{name}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self.components.append(Component(name, process, log))

    def _check_alive(self) -> None:
        for component in self.components:
            if component.process.poll() is not None:
                raise component.failure(f"exited with {component.process.returncode}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_SECONDS
        while True:
            self._check_alive()
            try:
                if self.rest.get("/readyz") == "ok":
                    return
            except (OSError, ApiError):
                pass
            if time.monotonic() > deadline:
                raise self.components[-1].failure(f"not ready within {READY_SECONDS:.0f} s")
            time.sleep(0.1)

    def _wait(self, name: str, path: str) -> None:
        deadline = time.monotonic() + READY_SECONDS
        while self.rest.find(path) is None:
            self._check_alive()
            if time.monotonic() > deadline:
                component = next(c for c in self.components if c.name == name)
                raise component.failure(f"did not create {path} within {READY_SECONDS:.0f} s")
            time.sleep(0.1)

    def _create_node(self) -> None:
        """The Node pods are scheduled to: untainted, Ready, large allocatable, loopback IP."""
        path = f"/api/v1/nodes/{NODE_NAME}"
        labels = {"kubernetes.io/hostname": NODE_NAME, "kubernetes.io/os": "linux"}
        node: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE_NAME, "labels": labels},
        }
        self.rest.create("/api/v1/nodes", node)
        # Admission taints a new Node not-ready; no node-lifecycle controller will lift it.
        self.rest.patch(path, {"spec": {"taints": None}})
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "process kubelet",
        }
        self.rest.patch(path + "/status", {"status": {
            "capacity": NODE_RESOURCES, "allocatable": NODE_RESOURCES, "conditions": [ready],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                          {"type": "Hostname", "address": NODE_NAME}],
        }})  # fmt: skip


def wait_established(rest: Rest, crd_name: str, timeout: float = 30.0) -> None:
    """Waits until the CRD ``crd_name`` reports condition Established=True."""
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd_name}"
    deadline = time.monotonic() + timeout
    while True:
        # A CRD just created may answer "conditions": null until the server fills it in.
        conditions = (rest.get(path).get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"CRD {crd_name} not Established within {timeout:.0f} s")
        time.sleep(0.05)
