"""The real ``kubectl`` of the API server's version (1.20), for tests that use it as users do.

Debian bookworm's ``kubernetes-client`` package is kubectl v1.20.2, the version
of the test control plane. ``kubectl_120`` finds it in the per-machine cache
(``<cache>/kubectl/usr/bin/kubectl``), else unpacks the .deb with ``dpkg -x``
(downloading it with ``apt-get download`` through the cache's private sources
list, as ``build_control_plane.sh`` fetches etcd). A machine that cannot get it
fails the test with the reason: it is never skipped silently.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .cluster import Binaries

PACKAGE = "kubernetes-client"
VERSION = "v1.20.2"


class KubectlUnavailable(RuntimeError):
    """kubectl 1.20 is not in the cache and could not be fetched; the message says why."""


def kubectl_120() -> Path:
    """The path of kubectl v1.20.2, unpacked into the cache on first use."""
    cache = Binaries.in_cache().cache
    binary = cache / "kubectl" / "usr" / "bin" / "kubectl"
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    debs = cache / "debs"
    found = sorted(debs.glob(f"{PACKAGE}_*.deb")) if debs.is_dir() else []
    if not found:
        sources = cache / "sources.list"
        if not sources.is_file():
            raise KubectlUnavailable(
                f"no {PACKAGE} .deb in {debs} and no {sources} (run build_control_plane.sh)"
            )
        debs.mkdir(parents=True, exist_ok=True)
        options = [
            "-o", f"Dir::Etc::sourcelist={sources}", "-o", "Dir::Etc::sourceparts=/dev/null",
            "-o", f"Dir::State::Lists={cache / 'lists'}", "-o", f"Dir::Cache={cache / 'apt-cache'}",
        ]  # fmt: skip
        got = subprocess.run(
            ["apt-get", *options, "download", PACKAGE],
            cwd=debs, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        found = sorted(debs.glob(f"{PACKAGE}_*.deb"))
        if got.returncode != 0 or not found:
            raise KubectlUnavailable(f"apt-get download {PACKAGE} failed: {got.stderr[-500:]}")
    unpacked = subprocess.run(
        ["dpkg", "-x", str(found[-1]), str(cache / "kubectl")], capture_output=True, text=True
    )
    if unpacked.returncode != 0 or not binary.is_file():
        raise KubectlUnavailable(f"dpkg -x {found[-1]} failed: {unpacked.stderr[-500:]}")
    return binary


def kubectl(
    kubeconfig: Path, *args: str, timeout: float = 120, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run kubectl 1.20 against the test cluster."""
    return subprocess.run(
        [str(kubectl_120()), f"--kubeconfig={kubeconfig}", *args],
        input=stdin, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
