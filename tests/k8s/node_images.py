"""The real node's images, built offline and cached: pause, Debian + Python, treadle.

``build_node.sh`` leaves a static ``pause`` binary and a debootstrap root
filesystem (Debian bookworm with Python 3.11) in ``<cache>/node``; this module
packs them as OCI archives for ``ctr images import`` (``oci_image``), and
builds treadle's image from ``docker/Dockerfile`` itself, without Docker
(``dockerfile``): ``--build-arg BASE=treadle.test/debian-python:bookworm``
points both stages at the debootstrap tree, and every RUN gets
``PIP_NO_INDEX=1`` and ``PIP_FIND_LINKS=/wheelhouse``, a read-only bind mount
of wheels the host built (``pip wheel`` of pyproject's build backend,
dependencies and the image's extras): the container build fetches nothing
(its RUN steps have no network). Archives are cached under
``<cache>/node/images``: the base ones by name, treadle's by a digest of the
Dockerfile and what it copies, so an unchanged checkout reuses its image.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .dockerfile import BaseImage, Dockerfile, Plan, run_logged
from .oci_image import (
    ImageBuildError,
    ImageConfig,
    extend_oci_archive,
    manifest_digest,
    tagged_oci_archive,
    write_oci_archive,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PAUSE_IMAGE = "treadle.test/pause:3.4"
BASE_IMAGE = "treadle.test/debian-python:bookworm"
TREADLE_IMAGE = "treadle.test/treadle:dev"
# treadle's image + tests/k8s/k8s_workflows.py: what a WorkflowDeployment's image is.
WORKFLOWS_IMAGE = "treadle.test/shop:dev"
WORKFLOWS_FILE = HERE / "k8s_workflows.py"
WORKFLOWS_MODULE = "/app/k8s_workflows.py"
# The public image's file, built here FROM the debootstrap tree; the extras it installs.
DOCKERFILE = REPO / "docker" / "Dockerfile"
TREADLE_EXTRAS = "postgres,nats,operator"
# Where every RUN of the Dockerfile finds the host's wheels (PIP_FIND_LINKS).
WHEELHOUSE_TARGET = "/wheelhouse"
# What every RUN gets instead of an index (a `docker build` behind a mirror: pip's config).
RUN_ENV = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": WHEELHOUSE_TARGET}
KEEP_TREADLE_IMAGES = 3
KEEP_TAG_ARCHIVES = 12


@dataclass(frozen=True)
class ImageArchive:
    name: str
    path: Path


class NodeImages:
    """Packs (once) and lists the OCI archives of the node's images."""

    def __init__(self, node_cache: Path, progress: Callable[[str], None]) -> None:
        self.node_cache = node_cache
        self.images = node_cache / "images"
        self.progress = progress
        self.log = node_cache / "images.log"

    def all(self) -> list[ImageArchive]:
        self.images.mkdir(parents=True, exist_ok=True)
        with (self.images / "build.lock").open("w") as lock:
            # Two test sessions share the cache: the second waits for the first's build.
            fcntl.flock(lock, fcntl.LOCK_EX)
            treadle = self.treadle()
            return [self.pause(), self.base(), treadle, self.workflows(treadle)]

    def pause(self) -> ImageArchive:
        out = self.images / "pause.oci.tar"
        if not out.is_file():
            rootfs = self.images / "pause-rootfs"
            shutil.rmtree(rootfs, ignore_errors=True)
            rootfs.mkdir()
            shutil.copy2(self.node_cache / "pause", rootfs / "pause")
            write_oci_archive(rootfs, out, PAUSE_IMAGE, ImageConfig(entrypoint=["/pause"], env=[]))
            shutil.rmtree(rootfs)
        return ImageArchive(PAUSE_IMAGE, out)

    def base(self) -> ImageArchive:
        out = self.images / "debian-python.oci.tar"
        if not out.is_file():
            self.progress("packing the Debian + Python base image")
            write_oci_archive(self._base_rootfs(), out, BASE_IMAGE, ImageConfig(cmd=["python3"]))
        return ImageArchive(BASE_IMAGE, out)

    def treadle(self) -> ImageArchive:
        """``docker/Dockerfile`` built FROM the Debian + Python tree (``--build-arg BASE``).

        Cached by a digest of the Dockerfile, its .dockerignore, every file its COPYs
        read, the executor, the wheelhouse's requirements and the base tree.
        """
        plan = self._treadle_plan()
        wheelhouse = self._wheelhouse()
        base_stamp = str((self._base_rootfs() / ".complete").stat().st_mtime_ns)
        key = plan.digest(REPO, extra=[wheelhouse.name, base_stamp, json.dumps(RUN_ENV)])
        out = self.images / f"treadle.{key}.oci.tar"
        if not out.is_file():
            # Other checkouts share this cache (and may be importing theirs): keep a few.
            _keep_newest(self.images, "treadle.*.oci.tar")
            self.progress(f"building docker/Dockerfile FROM {BASE_IMAGE} ({key}), log: {self.log}")
            began = time.monotonic()
            self._build_treadle(plan, wheelhouse, out)
            self.progress(f"treadle's image built in {time.monotonic() - began:.0f} s")
        return ImageArchive(TREADLE_IMAGE, out)

    def workflows(self, treadle: ImageArchive) -> ImageArchive:
        """``FROM treadle`` + ``COPY k8s_workflows.py /app/``: the operator tests' image."""
        digest = hashlib.sha256(treadle.path.name.encode() + WORKFLOWS_FILE.read_bytes())
        out = self.images / f"shop-{digest.hexdigest()[:16]}.oci.tar"
        if not out.is_file():
            _keep_newest(self.images, "shop-*.oci.tar")
            layer = self.images / "shop-layer"
            shutil.rmtree(layer, ignore_errors=True)
            (layer / "app").mkdir(parents=True)
            shutil.copyfile(WORKFLOWS_FILE, layer / WORKFLOWS_MODULE.lstrip("/"))
            # The layer's directories become the image's: / and /app must stay 0755.
            for path, mode in ((layer, 0o755), (layer / "app", 0o755),
                               (layer / WORKFLOWS_MODULE.lstrip("/"), 0o644)):  # fmt: skip
                path.chmod(mode)
            extend_oci_archive(treadle.path, layer, out, WORKFLOWS_IMAGE)
            shutil.rmtree(layer)
        return ImageArchive(WORKFLOWS_IMAGE, out)

    def tagged(self, workflows: ImageArchive, tags: tuple[str, ...], file: str) -> ImageArchive:
        """``FROM workflows`` + a file ``file`` holding the tag, for each of ``tags`` (short
        names: "shop:1" is ``docker.io/library/shop:1`` to the runtime), in one thin archive
        (the workflows image's layers left out: import it after that image). Cached."""
        # By the workflows image's manifest digest: the layers this thin archive refers to
        # (an archive's name stays when a rebuild changes its layers).
        key = hashlib.sha256(f"{manifest_digest(workflows.path)} {file} {tags}".encode())
        out = self.images / f"tags-{key.hexdigest()[:16]}.oci.tar"
        with (self.images / "build.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not out.is_file():
                # Thin (a few KiB each), and a session may make a tag or two beyond TAGS.
                _keep_newest(self.images, "tags-*.oci.tar", keep=KEEP_TAG_ARCHIVES)
                work = self.images / "tags-layers"
                shutil.rmtree(work, ignore_errors=True)
                layers: dict[str, Path] = {}
                for number, tag in enumerate(tags):
                    root = work / str(number)
                    target = root / file.lstrip("/")
                    target.parent.mkdir(parents=True)
                    target.write_text(tag + "\n")
                    # The layer's directories become the image's: they must stay 0755.
                    for path in (root, *[p for p in target.parents if root in p.parents]):
                        path.chmod(0o755)
                    target.chmod(0o644)
                    layers[f"docker.io/library/{tag}"] = root
                tagged_oci_archive(workflows.path, layers, out, thin=True)
                shutil.rmtree(work)
        return ImageArchive(f"the tags {', '.join(tags)}", out)

    def _base_rootfs(self) -> Path:
        rootfs = self.node_cache / "base-rootfs"
        if not (rootfs / ".complete").is_file():
            raise ImageBuildError(f"no debootstrap tree in {rootfs}: build_node.sh did not finish")
        return rootfs

    def _wheelhouse(self) -> Path:
        """The offline index of treadle's build: wheels of its dependencies and build backend.

        Built on the host (``pip wheel``, which may use the network or a mirror), keyed by
        what pyproject.toml requires, and bind-mounted read-only into every RUN of the
        Dockerfile as ``PIP_FIND_LINKS`` with ``PIP_NO_INDEX=1``: inside, nothing is fetched.
        """
        requirements = _wheelhouse_requirements()
        key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:16]
        wheelhouse = self.images / f"wheelhouse-{key}"
        if (wheelhouse / ".complete").is_file():
            return wheelhouse
        for stale in self.images.glob("wheelhouse-*"):
            shutil.rmtree(stale)
        partial = self.images / f"partial-wheelhouse-{key}"
        shutil.rmtree(partial, ignore_errors=True)
        argv = [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(partial),
                *requirements]  # fmt: skip
        self.progress(f"host pip wheel of treadle's {len(requirements)} requirements")
        began = time.monotonic()
        run_logged(argv, self.log, "pip wheel of treadle's requirements on the host")
        self.progress(f"wheelhouse built in {time.monotonic() - began:.0f} s: {wheelhouse}")
        (partial / ".complete").write_text("\n".join(requirements) + "\n")
        partial.rename(wheelhouse)
        return wheelhouse

    def _treadle_plan(self) -> Plan:
        dockerfile = Dockerfile.parse(DOCKERFILE, str(DOCKERFILE.relative_to(REPO)))
        base = ImageConfig(cmd=["python3"])
        images = {BASE_IMAGE: BaseImage(self._base_rootfs(), base)}
        return dockerfile.plan({"BASE": BASE_IMAGE}, images)

    def _build_treadle(self, plan: Plan, wheelhouse: Path, out: Path) -> None:
        work = self.images / "treadle-build"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        self.log.write_text("")
        built = plan.execute(
            REPO, work, self.log,
            run_env=RUN_ENV,
            run_mounts=[(wheelhouse, WHEELHOUSE_TARGET)],
        )  # fmt: skip
        write_oci_archive(built.rootfs, out, TREADLE_IMAGE, built.config)
        shutil.rmtree(work)


def _keep_newest(images: Path, pattern: str, keep: int = KEEP_TREADLE_IMAGES) -> None:
    """Before one more archive is written: delete all but the newest ``keep - 1`` of
    ``pattern``. Other checkouts share this cache and may be
    about to import theirs (deleting every other one made two worktrees rebuild each
    other's images each session)."""
    stale = sorted(images.glob(pattern), key=lambda p: p.stat().st_mtime)
    for old in stale[: max(0, len(stale) - keep + 1)]:
        old.unlink(missing_ok=True)


def _wheelhouse_requirements() -> list[str]:
    """pyproject's build backend, dependencies and the image's extras, as pip requirements."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    requirements = [*project["build-system"]["requires"], *project["project"]["dependencies"]]
    for extra in TREADLE_EXTRAS.split(","):
        requirements.extend(extras[extra])
    return sorted(set(requirements))


BUILD_SCRIPT = HERE / "build_node.sh"


def node_parts_present(cache: Path) -> bool:
    """Whether ``build_node.sh`` has nothing left to do in the cache ``cache``."""
    prefix, node = cache / "prefix", cache / "node"
    paths = (
        cache / "kubernetes-1.20.2" / "_output" / "bin" / "kubelet",
        prefix / "usr" / "bin" / "containerd",
        prefix / "usr" / "sbin" / "runc",
        prefix / "usr" / "lib" / "cni" / "loopback",
        node / "pause",
        node / "base-rootfs" / ".complete",
    )
    return all(path.is_file() for path in paths)


def ensure_node_parts(cache: Path, log_path: Path, progress: Callable[[str], None]) -> None:
    """Runs ``build_node.sh`` (under the control plane's build lock) when parts are missing."""
    if node_parts_present(cache):
        return
    with (cache / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if node_parts_present(cache):
            return
        progress(f"building the real node (kubelet, runtime, debootstrap), log: {log_path}")
        began = time.monotonic()
        with (
            log_path.open("w") as log,
            subprocess.Popen(
                ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, text=True, errors="replace",
                env={**os.environ, "TREADLE_K8S_CACHE": str(cache)},
            ) as build,
        ):  # fmt: skip
            assert build.stdout is not None
            for line in build.stdout:
                log.write(line)
                if line.startswith("== "):
                    progress(line.rstrip())
        if build.returncode != 0 or not node_parts_present(cache):
            raise ImageBuildError(
                f"{BUILD_SCRIPT.name} failed (exit {build.returncode}); see {log_path}"
            )
        progress(f"real node built in {time.monotonic() - began:.0f} s")
