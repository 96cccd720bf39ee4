"""Fixtures for ``treadle serve`` tests: ``create_app(ctx)`` under a real uvicorn server on
127.0.0.1 (an ephemeral port), over a real World, with httpx clients (issue 13).

- ``start_serve(world="local" | pg_world, insecure=False, **serve_settings)``: starts
  one server and returns a ``Served`` (``pg_world``: the fixture, a Postgres + NATS
  harness on a fresh database and stream). Serve settings are ``TREADLE_SERVE_*``
  overrides (``TREADLE_SERVE_TOKEN=None`` unsets the default token); by default the
  full token is ``FULL_TOKEN`` and the read-only one ``READ_TOKEN``.
- ``served``: ``start_serve()`` on the local World; ``served_pg``: on Postgres + NATS
  (real servers from tests/postgres and tests/nats); ``served_any``: both, parametrized
  (``any_world``).
- ``Served.app`` is a ``Workflows`` with its worker on the same World: register the
  test's workflows on it (``@served.app.workflow``), then ``await served.app.start(...)``.
- ``Served.client`` sends the full token, ``reader`` the read-only one, ``anonymous``
  none; ``client_for(token=..., headers=...)`` makes another (closed at teardown).

Everything is closed at teardown: clients, the server (streams end), the app, the World.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from treadle import Workflows, settings
from treadle.serve import settings as serve_settings
from treadle.serve.app import Server
from treadle.serve.context import ServeContext
from treadle.world import contract
from treadle.worlds.local import LocalWorld

from ..nats.conftest import NatsServer, nats_server
from ..postgres.conftest import pg_clones, pg_dsn, pg_server
from ..production.conftest import ProductionHarness

__all__ = ["nats_server", "pg_clones", "pg_dsn", "pg_server"]

FULL_TOKEN = "full-" + secrets.token_hex(16)
READ_TOKEN = "read-" + secrets.token_hex(16)
FAST = {
    "WORKFLOW_ORCHESTRATOR_LINGER_MS": 300,
    "WORKFLOW_ORCHESTRATOR_POLL_INTERVAL_MS": 200,
    "WORKFLOW_STEP_RETRY_DELAY_SECONDS": 0.05,
}
TUNING = contract.QueueTuning(lease_seconds=5.0, backoff_base_seconds=0.05, backoff_max_seconds=0.5)
HTTP_TIMEOUT = httpx.Timeout(10.0)


@dataclass
class Served:
    """One running ``treadle serve`` and what a test drives it with."""

    url: str
    world: contract.World
    app: Workflows
    ctx: ServeContext
    server: Server
    client: httpx.AsyncClient
    reader: httpx.AsyncClient
    anonymous: httpx.AsyncClient
    _extra: list[httpx.AsyncClient] = field(default_factory=list)

    def client_for(
        self, token: str | None = None, headers: dict[str, str] | None = None
    ) -> httpx.AsyncClient:
        """An httpx client on the server with this bearer token and/or these headers."""
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        made = httpx.AsyncClient(base_url=self.url, headers=sent, timeout=HTTP_TIMEOUT)
        self._extra.append(made)
        return made

    async def aclose(self) -> None:
        for c in [self.client, self.reader, self.anonymous, *self._extra]:
            await c.aclose()


StartServe = Callable[..., Awaitable[Served]]

DEFAULT_TOKENS: dict[str, Any] = {
    "TREADLE_SERVE_TOKEN": FULL_TOKEN,
    "TREADLE_SERVE_READONLY_TOKEN": READ_TOKEN,
}


@pytest.fixture
def pg_world(pg_dsn: str, nats_server: NatsServer) -> ProductionHarness:
    """A Postgres + NATS World on a database and a stream of this test's own."""
    return ProductionHarness(pg_dsn, nats_server.url, "local")


@pytest.fixture
async def start_serve(tmp_path: Path) -> AsyncIterator[StartServe]:
    running: list[tuple[Served, Workflows, contract.World]] = []
    opened = 0

    async def open_world(kind: str | ProductionHarness) -> contract.World:
        nonlocal opened
        opened += 1
        if isinstance(kind, ProductionHarness):
            return await kind.open(TUNING)
        if kind == "local":
            return await LocalWorld(tmp_path / f"world-{opened}", tuning=TUNING).open()
        raise ValueError(f"unknown World {kind!r} (local, or the pg_world fixture)")

    async def start(
        world: str | ProductionHarness = "local", *, insecure: bool = False, **overrides: Any
    ) -> Served:
        values = {**DEFAULT_TOKENS, **overrides}
        values = {k: v for k, v in values.items() if v is not None}
        opened_world = await open_world(world)
        engine = settings.load({}, **FAST)
        app = Workflows(world=opened_world, settings_=engine, worker=True)
        await app.world()  # starts its worker on this World
        ctx = ServeContext(
            world=opened_world,
            settings=engine,
            serve=serve_settings.load({}, **values),
            insecure_no_auth=insecure,
        )
        server = Server(ctx, host="127.0.0.1", port=0)
        await server.start()

        def make(token: str | None) -> httpx.AsyncClient:
            headers = {} if token is None else {"Authorization": f"Bearer {token}"}
            return httpx.AsyncClient(base_url=server.url, headers=headers, timeout=HTTP_TIMEOUT)

        served = Served(
            url=server.url,
            world=opened_world,
            app=app,
            ctx=ctx,
            server=server,
            client=make(values.get("TREADLE_SERVE_TOKEN")),
            reader=make(values.get("TREADLE_SERVE_READONLY_TOKEN")),
            anonymous=make(None),
        )
        running.append((served, app, opened_world))
        return served

    yield start
    for served, app, world in reversed(running):
        await served.aclose()
        await served.server.stop()
        await app.close(grace_seconds=2)
        await world.close()


@pytest.fixture
async def served(start_serve: StartServe) -> Served:
    """``treadle serve`` on a fresh local World, with the default tokens."""
    return await start_serve()


@pytest.fixture
async def served_pg(start_serve: StartServe, pg_world: ProductionHarness) -> Served:
    """``treadle serve`` on Postgres + NATS (real servers), with the default tokens."""
    return await start_serve(pg_world)


@pytest.fixture(params=["local", "postgres+nats"])
def any_world(request: pytest.FixtureRequest) -> str | ProductionHarness:
    if request.param == "local":
        return "local"
    harness: ProductionHarness = request.getfixturevalue("pg_world")
    return harness


@pytest.fixture
async def served_any(start_serve: StartServe, any_world: str | ProductionHarness) -> Served:
    """``treadle serve`` on each World in turn (local, then Postgres + NATS)."""
    return await start_serve(any_world)
