"""The crash tests run on both Worlds; Postgres + NATS uses the suites' real servers."""

from __future__ import annotations

from ..nats.conftest import nats_server
from ..postgres.conftest import pg_clones, pg_dsn, pg_server

__all__ = ["nats_server", "pg_clones", "pg_dsn", "pg_server"]
