"""What a killed test session's real node left running, found and ended by the next one.

containerd and the kubelet die with pytest (``die_with_parent``), but a pod's
containers and their shims are daemons: after a ``kill -9`` of pytest they
would run on (holding host ports on the host network) until the machine
restarts. So each ``RealNode`` registers itself in ``<cache>/node/runs`` (its
run directory, containerd's pid and socket, its cgroup root) and unregisters
at stop; a node starting sweeps every entry whose containerd is gone: it kills
and deletes the containers through runc's state (``<run>/runc/k8s.io``), kills
the shims serving that socket, unmounts what is left under the run directory
and removes the cgroup root. An entry whose containerd still runs belongs to
a live session and is left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunEntry:
    root: str
    containerd_pid: int
    socket: str
    cgroup_root: str


def register(runs: Path, name: str, entry: RunEntry) -> Path:
    runs.mkdir(parents=True, exist_ok=True)
    path = runs / f"{name}.json"
    path.write_text(json.dumps(asdict(entry)))
    return path


def _alive(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"containerd" in cmdline


def _shims_of(socket: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = proc.joinpath("cmdline").read_bytes().split(b"\0")
            if argv and b"containerd-shim" in argv[0] and socket.encode() in argv:
                found.append(int(proc.name))
    return found


def sweep(runs: Path, runc: Path, cgroup_hierarchies: list[Path]) -> list[str]:
    """Ends what dead runs registered in ``runs`` left; the run directories swept."""
    swept = []
    for path in sorted(runs.glob("*.json")) if runs.is_dir() else []:
        try:
            entry = RunEntry(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            path.unlink(missing_ok=True)
            continue
        if _alive(entry.containerd_pid):
            continue
        state = Path(entry.root) / "runc" / "k8s.io"
        for container in sorted(state.iterdir()) if state.is_dir() else []:
            base = [str(runc), "--root", str(state)]
            subprocess.run(
                [*base, "kill", container.name, "KILL"], capture_output=True, check=False
            )
            subprocess.run([*base, "delete", "--force", container.name], capture_output=True,
                           check=False)  # fmt: skip
        for pid in _shims_of(entry.socket):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        prefix = str(Path(entry.root).resolve()) + "/"
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
        for hierarchy in cgroup_hierarchies:
            top = hierarchy / entry.cgroup_root.lstrip("/")
            for directory in sorted((p for p in top.rglob("*") if p.is_dir()), reverse=True):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()
        path.unlink(missing_ok=True)
        swept.append(entry.root)
    return swept
