"""Fixtures for seed 000's end-to-end tests of spec 8 runs, on both Worlds.

``make_app``, ``open_world`` and ``faulty`` are the engine suites' (tests/engine/conftest.py):
each test runs on the local World and on Postgres + NATS. ``cluster`` (procs.py) is a
World shared by ``treadle worker`` subprocesses (killed mid-body) and this process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ..engine.conftest import MakeApp, faulty, make_app, open_world
from ..nats.conftest import nats_server
from ..postgres.conftest import pg_clones, pg_dsn, pg_server
from .procs import Cluster

__all__ = [
    "MakeApp",
    "faulty",
    "make_app",
    "nats_server",
    "open_world",
    "pg_clones",
    "pg_dsn",
    "pg_server",
]


@pytest.fixture(params=["local", "postgres+nats"])
def cluster_world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """A World for worker subprocesses and this process: local, or Postgres + NATS."""
    if request.param == "local":
        c = Cluster.local(tmp_path)
    else:
        c = Cluster.production(
            tmp_path,
            request.getfixturevalue("pg_dsn"),
            request.getfixturevalue("nats_server").url,
        )
    yield c
    c.stop()


@pytest.fixture
async def cluster(
    cluster_world: Cluster, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Cluster]:
    """``cluster_world``, with this process's step bodies recording to its effects file;
    closes the apps and Worlds this process opened on it."""
    monkeypatch.setenv("TREADLE_TEST_EFFECTS", str(cluster_world.effects))
    try:
        yield cluster_world
    finally:
        await cluster_world.aclose()
