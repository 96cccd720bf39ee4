"""Small process helpers shared by the control plane and the process kubelet.

``die_with_parent`` makes a child receive SIGKILL when the thread that started
it exits, so a killed pytest never leaves etcd, an API server or a pod's
process behind. ``free_port`` picks a loopback port; ``tail`` reads the end of
a log for an error message.
"""

from __future__ import annotations

import ctypes
import signal
import socket
from pathlib import Path

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` for children: SIGKILL them when their parent thread dies (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, limit: int, start: int = 0) -> str:
    """At most the last ``limit`` bytes of ``path`` past offset ``start``, as text.

    When that cuts the text, it starts after the first line break (if there is one).
    """
    try:
        with path.open("rb") as file:
            size = file.seek(0, 2)
            file.seek(max(start, size - limit))
            data = file.read()
    except FileNotFoundError:
        return ""
    if size - start > limit and b"\n" in data[:-1]:
        data = data[data.index(b"\n") + 1 :]
    return data.decode(errors="replace")
