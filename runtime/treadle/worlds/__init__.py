"""World implementations (``local``, ``postgres`` + ``nats``) and opening one by URL.

``open_world("local:.treadle")`` opens the embedded World under ``.treadle``;
``open_world("postgres")`` the production World from its settings;
``open_world("memory")`` a fresh in-memory World (``treadle.testing.memory``),
gone when the process ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from treadle import errors
from treadle.world import contract

if TYPE_CHECKING:
    from treadle.settings import Settings


async def open_world(
    url: str,
    *,
    tuning: contract.QueueTuning | None = None,
    settings: Settings | None = None,
) -> contract.World:
    """Open the World a URL names: ``local:PATH`` (a bare ``local`` means ``.treadle``),
    ``postgres`` (Postgres storage and a NATS queue, from ``TREADLE_DATABASE_URL`` and
    ``TREADLE_NATS_URL``), or ``memory`` (a new in-memory World: ``TREADLE_WORLD=memory``
    for tests and trials; nothing outlives the process)."""
    scheme, _, rest = url.partition(":")
    if tuning is None and settings is not None:
        tuning = contract.QueueTuning(
            lease_seconds=settings.TREADLE_QUEUE_LEASE_SECONDS,
            max_failed_deliveries=settings.TREADLE_QUEUE_MAX_FAILED_DELIVERIES,
            worker_id=settings.TREADLE_WORKER_ID,
            liveness_seconds=settings.TREADLE_WORKER_LIVENESS_SECONDS,
        )
    if scheme == "local":
        from treadle.worlds.local import LocalWorld

        return await LocalWorld(rest or ".treadle", tuning=tuning).open()
    if url == "memory":
        from treadle.testing.memory import MemoryWorld

        return await MemoryWorld(tuning=tuning).open()
    if url == "postgres":
        from treadle.settings import load
        from treadle.worlds.production import PostgresNatsWorld
        from treadle.worlds.transport import Transport

        config = settings or load()
        database_url = config.secret_url("TREADLE_DATABASE_URL")
        nats_url = config.secret_url("TREADLE_NATS_URL")
        if database_url is None or nats_url is None:
            raise errors.SettingsError(
                "TREADLE_WORLD=postgres needs TREADLE_DATABASE_URL and TREADLE_NATS_URL "
                "(or TREADLE_DATABASE_URL_FILE and TREADLE_NATS_URL_FILE)"
            )
        return await PostgresNatsWorld.connect(
            database_url,
            nats_url,
            deployment_id=config.TREADLE_DEPLOYMENT_ID,
            tuning=tuning,
            statement_timeout_ms=config.TREADLE_DATABASE_STATEMENT_TIMEOUT_MS,
            pool_size=config.TREADLE_DATABASE_POOL_SIZE,
            # Only where it is set: a process without it never moves an existing stream.
            stream_replicas=config.TREADLE_NATS_STREAM_REPLICAS
            if "TREADLE_NATS_STREAM_REPLICAS" in config.model_fields_set
            else None,
            transport=Transport.from_settings(config),
            statement_cache_size=config.TREADLE_DATABASE_STATEMENT_CACHE_SIZE,
            group_writes=config.TREADLE_DATABASE_GROUP_WRITES,
        )
    from treadle.redaction import looks_secret, shown

    hint = " (put a database URL in TREADLE_DATABASE_URL)" if looks_secret(url) else ""
    raise errors.SettingsError(
        f"TREADLE_WORLD={shown(url)} is not a World treadle knows; "
        f"use local:PATH, postgres or memory{hint}"
    )
