"""Spec 8 tests run on both Worlds with the engine suites' fixtures."""

from __future__ import annotations

from ..engine.conftest import MakeApp, faulty, make_app, open_world
from ..nats.conftest import nats_server
from ..postgres.conftest import pg_clones, pg_dsn, pg_server

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
