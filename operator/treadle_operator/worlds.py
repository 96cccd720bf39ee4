"""Connections to the Worlds that WorkflowDeployments name, opened once and shared.

A WorkflowDeployment names a Secret holding the World's PostgreSQL and NATS
URLs. ``Worlds.get`` reads it and returns one open ``PostgresNatsWorld`` per
distinct pair of URLs, so a hundred deployments on one World share one pool.
The Secret's optional transport keys (``transport``: NATS credentials and TLS,
Postgres TLS) apply to the operator's connection as to the workers'.
The operator never consumes a queue, so the deployment id a connection is
opened with does not matter: sends are routed by each message's own.

Rotation (review R9). A connection is keyed by what the Secret says (the URLs,
credentials included, and the transport settings), read again on every ``get``
(every reconcile). When a Secret's content changes, the next ``get`` opens a
connection for the new content and, once no Secret read names the old content
any more, *replaces* the old one: ``current(old)`` answers the new connection
from then on, ``on_replaced(old, new)`` tells the holders (the status sync's
``repoint`` stops the old LISTEN and moves its runs), and the old connection is
closed ``CLOSE_GRACE_SECONDS`` later (calls already under way on it may end).
``generation`` counts replacements, for holders that would rather poll.
``secret_checksum`` is the digest of the keys the workers read, for the worker
Deployments' pod template annotation (a change rolls them).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
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


@dataclass(frozen=True)
class _Reading:
    """One read of a World Secret: the URLs, and what the worker pods get from it."""

    urls: WorldUrls
    transport_keys: frozenset[str]
    checksum: str
    resource_version: str | None


OnOpened = Callable[[WorldUrls, PostgresNatsWorld], Awaitable[None]]
# (the replaced connection, the one replacing it)
OnReplaced = Callable[[PostgresNatsWorld, PostgresNatsWorld], Awaitable[None]]
SecretKey = tuple[str, str]  # (namespace, Secret name)
CLOSE_GRACE_SECONDS = 5.0


class Worlds:
    def __init__(
        self,
        kube: Kube,
        on_opened: OnOpened | None = None,
        allowed_hosts: worldhosts.Allowed = worldhosts.ANY,
        on_replaced: OnReplaced | None = None,
    ) -> None:
        self._kube = kube
        self._allowed_hosts = allowed_hosts
        self._open: dict[WorldUrls, PostgresNatsWorld] = {}
        self._lock = asyncio.Lock()
        self._on_opened = on_opened
        self.on_replaced = on_replaced
        self._transport_keys: dict[SecretKey, frozenset[str]] = {}
        self._checksums: dict[SecretKey, str] = {}
        self._versions: dict[SecretKey, str | None] = {}
        self._reads = itertools.count()  # orders Secret reads, so an older one never wins
        self._applied: dict[SecretKey, int] = {}
        self._named: dict[SecretKey, WorldUrls] = {}  # what each Secret said when last read
        self._successor: dict[int, tuple[PostgresNatsWorld, PostgresNatsWorld]] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self.generation = 0

    async def urls(self, namespace: str, ref: WorldRef) -> WorldUrls:
        """What the Secret says now (read, never recorded: ``get`` records what it applies)."""
        return (await self._read(namespace, ref)).urls

    async def _read(self, namespace: str, ref: WorldRef) -> _Reading:
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
        read = (ref.database_url_key, ref.nats_url_key, ref.payload_key_key, *keys)
        checksum, version = data.checksum(read), data.resource_version
        if not keys:
            urls = WorldUrls(data[ref.database_url_key], data[ref.nats_url_key])
            return _Reading(urls, keys, checksum, version)
        tls = transport.operator_transport(where, data)
        try:
            database_url = tls.postgres.dsn(data[ref.database_url_key])
        except Exception as exc:
            raise WorldSecretMissing(f"Secret {where}: {exc}") from None
        urls = WorldUrls(database_url, data[ref.nats_url_key], tls.nats)
        return _Reading(urls, keys, checksum, version)

    def transport_keys(self, namespace: str, ref: WorldRef) -> frozenset[str]:
        """The transport keys the Secret held when ``get`` last read it (for the worker pods)."""
        return self._transport_keys.get((namespace, ref.secret_name), frozenset())

    def secret_checksum(self, namespace: str, ref: WorldRef) -> str | None:
        """The digest of the keys the workers read, as ``get`` last read them (``None``: not
        yet)."""
        return self._checksums.get((namespace, ref.secret_name))

    async def payload_keys(self, namespace: str, ref: WorldRef) -> payloads.KeyRing | None:
        """The payload keys the World Secret carries (its workers' TREADLE_PAYLOAD_KEY)."""
        data = await self._kube.secret(namespace, ref.secret_name)
        text = data.get(ref.payload_key_key) if data is not None else None
        if not text:
            return None
        try:
            return payloads.KeyRing.parse(
                text, setting=f"Secret {namespace}/{ref.secret_name} key {ref.payload_key_key}"
            )
        except engine_errors.SettingsError as exc:
            raise WorldSecretMissing(str(exc)) from None

    async def get(self, namespace: str, ref: WorldRef) -> PostgresNatsWorld:
        """The open connection for what the Secret says now (opening it, replacing one
        the Secret named before when nothing else names that one)."""
        key = (namespace, ref.secret_name)
        ticket = next(self._reads)
        reading = await self._read(namespace, ref)
        urls = reading.urls
        worldhosts.check(self._allowed_hosts, urls.database_url, urls.nats_url)
        opened = False
        async with self._lock:
            newer = self._named.get(key)
            if self._applied.get(key, -1) > ticket and newer is not None and newer in self._open:
                return self._open[newer]  # a later read of the Secret won: never go back
            self._applied[key] = ticket
            world = self._open.get(urls)
            if world is None:
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
                opened = True
                log.info("opened the World at %s", urls)
            before = self._named.get(key)
            self._named[key] = urls
            self._transport_keys[key] = reading.transport_keys
            self._checksums[key] = reading.checksum
            self._versions[key] = reading.resource_version
            stale = None
            if before is not None and before != urls and before not in self._named.values():
                stale = before, self._open.pop(before, None)
        if opened and self._on_opened is not None:
            await self._on_opened(urls, world)
        if stale is not None and stale[1] is not None:
            version = self._versions.get(key)
            where = f"{namespace}/{ref.secret_name} (resourceVersion {version})"
            await self._replace(stale[0], stale[1], world, where)
        return world

    def current(self, world: PostgresNatsWorld) -> PostgresNatsWorld:
        """The connection serving what ``world`` served: itself, or what replaced it."""
        seen = 0
        while (found := self._successor.get(id(world))) is not None and seen < 1000:
            world, seen = found[1], seen + 1
        return world

    async def _replace(
        self, urls: WorldUrls, old: PostgresNatsWorld, new: PostgresNatsWorld, secret: str
    ) -> None:
        # The old object is kept in the map, so its id is never reused while mapped.
        self._successor[id(old)] = (old, new)
        self.generation += 1
        log.info(
            "Secret %s changed: its World connection at %s is replaced by a new one; "
            "the old one closes in %.0f s",
            secret,
            urls,
            CLOSE_GRACE_SECONDS,
        )
        if self.on_replaced is not None:
            try:
                await self.on_replaced(old, new)
            except Exception as exc:  # a holder's trouble never keeps the old one open
                log.warning("telling holders of the World at %s of its replacement: %s", urls, exc)
        task = asyncio.get_running_loop().create_task(
            self._close_later(urls, old), name=f"treadle-operator-close {urls}"
        )
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_later(self, urls: WorldUrls, world: PostgresNatsWorld) -> None:
        try:
            await asyncio.sleep(CLOSE_GRACE_SECONDS)
        finally:
            try:
                await world.close()
                log.info("closed the replaced World connection at %s", urls)
            except Exception as exc:
                log.warning("closing the replaced World connection at %s: %s", urls, exc)

    async def close(self) -> None:
        for task in list(self._closing):
            task.cancel()  # closes the replaced connection now
        for task in list(self._closing):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        async with self._lock:
            opened, self._open = list(self._open.values()), {}
        for world in opened:
            await world.close()
