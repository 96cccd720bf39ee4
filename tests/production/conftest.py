"""The production World (Postgres storage + NATS JetStream queue) on real servers.

Reuses the session servers of ``tests/postgres`` and ``tests/nats``; each test
gets its own database, stream, subject prefix and lease bucket.
"""

from __future__ import annotations

import itertools
import os
from typing import cast

import pytest

from treadle.world import contract
from treadle.world.conformance.harness import WorldHarness
from treadle.worlds.production import PostgresNatsWorld

from ..nats.conftest import NatsServer, nats_server
from ..postgres.conftest import pg_clones, pg_dsn, pg_server

__all__ = ["nats_server", "pg_clones", "pg_dsn", "pg_server"]

_serial = itertools.count(1)


class ProductionHarness(WorldHarness):
    """Opens a PostgresNatsWorld on one database and one stream, so a reopen sees it all."""

    def __init__(self, dsn: str, nats_url: str, deployment_id: str = "prod") -> None:
        tag = f"{os.getpid()}-{next(_serial)}"
        self.dsn = dsn
        self.nats_url = nats_url
        self.deployment_id = deployment_id
        self.stream = f"P{tag}"
        self.prefix = f"p{tag}"

    async def open(self, tuning: contract.QueueTuning | None = None) -> contract.World:
        world = await PostgresNatsWorld.connect(
            self.dsn,
            self.nats_url,
            deployment_id=self.deployment_id,
            tuning=tuning,
            stream=self.stream,
            subject_prefix=self.prefix,
        )
        return cast(contract.World, world)


@pytest.fixture
def harness(pg_dsn: str, nats_server: NatsServer) -> ProductionHarness:
    return ProductionHarness(pg_dsn, nats_server.url)
