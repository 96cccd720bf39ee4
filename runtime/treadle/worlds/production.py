"""The production World: Postgres storage (``worlds.postgres``) and a NATS JetStream queue
(``worlds.nats``), opened together from ``TREADLE_DATABASE_URL`` and ``TREADLE_NATS_URL``.

Credentials come from the URLs (or what they point at) and from the transport
settings (``transport``: NATS credentials and TLS, Postgres TLS); they are never
logged: errors name the host, not the URL.
"""

from __future__ import annotations

from treadle import errors
from treadle.redaction import redact_url
from treadle.world import contract
from treadle.worlds.transport import Transport, postgres_refusal

CAPABILITIES = contract.Capabilities(
    in_band_fence=True, serializes_runs=True, coalesces=True, live_feed=True
)


def redact(url: str) -> str:
    """A URL fit for a log line: scheme, host and port only (``treadle.redaction``)."""
    return redact_url(url)


class PostgresNatsWorld:
    """Storage on Postgres, queue on NATS JetStream: open with ``await PostgresNatsWorld.open``."""

    capabilities = CAPABILITIES

    def __init__(self, storage: object, queue: object) -> None:
        from treadle.worlds.nats import NatsQueue
        from treadle.worlds.postgres import PostgresStorage

        assert isinstance(storage, PostgresStorage)
        assert isinstance(queue, NatsQueue)
        self.storage = storage
        self.nats = queue
        self.runs: contract.Runs = storage.runs
        self.events: contract.Events = storage.events
        self.steps: contract.Steps = storage.steps
        self.hooks: contract.Hooks = storage.hooks
        self.deployments: contract.Deployments = storage.deployments
        self.limits: contract.LimitStore = storage.limits
        self.heartbeats: contract.Heartbeats = storage.heartbeats  # step heartbeats
        self.queue: contract.Queue = queue
        self.changes: contract.Changes = storage.changes
        self.schedules: contract.Schedules = storage.schedules  # issue 17 item 3
        self.streams: contract.Streams = storage.streams  # issue 17 item 6

    @classmethod
    async def connect(
        cls,
        database_url: str,
        nats_url: str,
        *,
        deployment_id: str,
        tuning: contract.QueueTuning | None = None,
        check_schema: bool = True,
        stream: str | None = None,
        subject_prefix: str | None = None,
        statement_timeout_ms: int | None = None,
        pool_size: int | None = None,
        stream_replicas: int | None = None,
        transport: Transport | None = None,
        statement_cache_size: int | None = None,
        group_writes: bool = True,
    ) -> PostgresNatsWorld:
        """Open both halves; ``transport`` carries credentials and TLS (default: none beyond
        the URLs). A server refusing them is ``WorldAuthFailed``, raised at once.
        ``pool_size`` (``TREADLE_DATABASE_POOL_SIZE``) bounds the storage connections,
        ``stream_replicas`` (``TREADLE_NATS_STREAM_REPLICAS``) the queue stream's copies
        (None: a new stream gets 1, an existing one keeps its count)."""
        from treadle.worlds.nats import NatsQueue, names
        from treadle.worlds.postgres import PostgresStorage
        from treadle.worlds.postgres.database import (
            DEFAULT_POOL_SIZE,
            STATEMENT_CACHE_SIZE,
            STATEMENT_TIMEOUT_MS,
        )

        if statement_timeout_ms is None:
            statement_timeout_ms = STATEMENT_TIMEOUT_MS
        if statement_cache_size is None:
            statement_cache_size = STATEMENT_CACHE_SIZE
        transport = transport or Transport()
        database_url = transport.postgres.dsn(database_url)
        try:
            storage = await PostgresStorage.connect(
                database_url,
                check_schema=check_schema,
                statement_timeout_ms=statement_timeout_ms,
                statement_cache_size=statement_cache_size,
                group_writes=group_writes,
                pool_size=DEFAULT_POOL_SIZE if pool_size is None else pool_size,
            )
        except OSError as exc:
            refusal = postgres_refusal(
                exc, f"cannot connect to PostgreSQL at {redact(database_url)}"
            )
            if refusal is not None:
                raise refusal from None
            raise errors.StorageUnavailable(
                f"cannot reach PostgreSQL at {redact(database_url)}: {exc.strerror or exc}"
            ) from None
        try:
            queue = await NatsQueue.connect(
                nats_url,
                deployment_id=deployment_id,
                tuning=tuning,
                stream=stream or names.DEFAULT_STREAM,
                subject_prefix=subject_prefix or names.DEFAULT_SUBJECT_PREFIX,
                replicas=stream_replicas,
                transport=transport.nats,
            )
        except BaseException:
            await storage.close()
            raise
        return cls(storage, queue)

    async def close(self) -> None:
        try:
            await self.nats.close()
        finally:
            await self.storage.close()
