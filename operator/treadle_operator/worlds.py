"""Connections to the Worlds that WorkflowDeployments name, opened once and shared.

A WorkflowDeployment names a Secret holding the World's PostgreSQL and NATS
URLs. ``Worlds.get`` reads it and returns one open ``PostgresNatsWorld`` per
distinct pair of URLs, so a hundred deployments on one World share one pool.
The Secret's optional transport keys (``transport``: NATS credentials and TLS,
Postgres TLS) apply to the operator's connection as to the workers'.
The operator never consumes a queue, so the deployment id a connection is
opened with does not matter: sends are routed by each message's own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from treadle import errors as engine_errors
from treadle import payloads
from treadle.worlds.production import PostgresNatsWorld, redact
from treadle.worlds.transport import NatsTransport, Transport
from treadle_operator import transport, worldhosts
from treadle_operator.errors import WorldSecretMissing, WorldUnavailable
from treadle_operator.kube import Kube
from treadle_operator.models import WorldRef

log = logging.getLogger("treadle.operator.worlds")


@dataclass(frozen=True)
class WorldUrls:
    """A World's two URLs; ``str`` and ``repr`` show only ``scheme://host:port`` of each.
    The DSN carries the Secret's Postgres TLS keys (sslmode, certificate files)."""

    database_url: str = field(repr=False)
    nats_url: str = field(repr=False)
    nats: NatsTransport = field(default_factory=NatsTransport, repr=False)

    def __str__(self) -> str:
        return f"{redact(self.database_url)} + {redact(self.nats_url)}"

    def __repr__(self) -> str:
        return f"WorldUrls({self})"


OnOpened = Callable[[WorldUrls, PostgresNatsWorld], Awaitable[None]]


class Worlds:
    def __init__(
        self,
        kube: Kube,
        on_opened: OnOpened | None = None,
        allowed_hosts: worldhosts.Allowed = worldhosts.ANY,
    ) -> None:
        self._kube = kube
        self._allowed_hosts = allowed_hosts
        self._open: dict[WorldUrls, PostgresNatsWorld] = {}
        self._lock = asyncio.Lock()
        self._on_opened = on_opened
        self._transport_keys: dict[tuple[str, str], frozenset[str]] = {}

    async def urls(self, namespace: str, ref: WorldRef) -> WorldUrls:
        data = await self._kube.secret(namespace, ref.secret_name)
        if data is None:
            raise WorldSecretMissing(f"Secret {namespace}/{ref.secret_name} does not exist")
        missing = [k for k in (ref.database_url_key, ref.nats_url_key) if not data.get(k)]
        if missing:
            raise WorldSecretMissing(
                f"Secret {namespace}/{ref.secret_name} has no key {', '.join(missing)}"
            )
        where = f"{namespace}/{ref.secret_name}"
        keys = transport.present(data)
        self._transport_keys[(namespace, ref.secret_name)] = keys
        if not keys:
            return WorldUrls(data[ref.database_url_key], data[ref.nats_url_key])
        tls = transport.operator_transport(where, data)
        try:
            database_url = tls.postgres.dsn(data[ref.database_url_key])
        except Exception as exc:
            raise WorldSecretMissing(f"Secret {where}: {exc}") from None
        return WorldUrls(database_url, data[ref.nats_url_key], tls.nats)

    def transport_keys(self, namespace: str, ref: WorldRef) -> frozenset[str]:
        """The transport keys the Secret held when last read (for the worker pods)."""
        return self._transport_keys.get((namespace, ref.secret_name), frozenset())

    async def payload_keys(self, namespace: str, ref: WorldRef) -> payloads.KeyRing | None:
        """The payload keys the World Secret carries (its workers' TREADLE_PAYLOAD_KEY)."""
        data = await self._kube.secret(namespace, ref.secret_name)
        text = (data or {}).get(ref.payload_key_key)
        if not text:
            return None
        try:
            return payloads.KeyRing.parse(
                text, setting=f"Secret {namespace}/{ref.secret_name} key {ref.payload_key_key}"
            )
        except engine_errors.SettingsError as exc:
            raise WorldSecretMissing(str(exc)) from None

    async def get(self, namespace: str, ref: WorldRef) -> PostgresNatsWorld:
        urls = await self.urls(namespace, ref)
        worldhosts.check(self._allowed_hosts, urls.database_url, urls.nats_url)
        async with self._lock:
            world = self._open.get(urls)
            if world is not None:
                return world
            try:
                world = await PostgresNatsWorld.connect(
                    urls.database_url,
                    urls.nats_url,
                    deployment_id="treadle-operator",
                    transport=Transport(nats=urls.nats),
                )
            except Exception as exc:
                raise WorldUnavailable(f"cannot open the World at {urls}: {exc}") from exc
            self._open[urls] = world
            log.info("opened the World at %s", urls)
        if self._on_opened is not None:
            await self._on_opened(urls, world)
        return world

    async def close(self) -> None:
        async with self._lock:
            opened, self._open = list(self._open.values()), {}
        for world in opened:
            await world.close()
