"""``treadle operator``: run the operator until SIGINT or SIGTERM."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

import kopf

from treadle_operator import handlers, kube, runs, secretcache, worldhosts
from treadle_operator.settings import OperatorSettings
from treadle_operator.state import State
from treadle_operator.sync import StatusSync
from treadle_operator.worlds import Worlds

log = logging.getLogger("treadle.operator")


async def run(namespaces: Sequence[str] = ()) -> None:
    """Serve ``namespaces`` (every namespace when empty) until stopped."""
    settings = OperatorSettings()
    logging.basicConfig(
        level=settings.TREADLE_LOG_LEVEL, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if settings.TREADLE_LOG_LEVEL != "DEBUG":
        # kopf tells of every handler that succeeded; ours log what matters.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        logging.getLogger("kopf.activities").setLevel(logging.WARNING)
    client = secretcache.CachingKube(
        await kube.login(), max_age=settings.TREADLE_OPERATOR_SECRET_CACHE_SECONDS
    )
    sync = StatusSync(client)
    worlds = Worlds(
        client,
        on_opened=sync.listen,
        allowed_hosts=worldhosts.parse(settings.TREADLE_OPERATOR_WORLD_HOSTS),
    )
    state = State(
        settings=settings, kube=client, worlds=worlds, sync=sync, namespaces=tuple(namespaces)
    )

    sync.on_new_run = functools.partial(runs.mirror, state)
    registry = handlers.build_registry(state)
    log.info(
        "treadle operator serving %s", ", ".join(namespaces) if namespaces else "every namespace"
    )
    try:
        await kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=not namespaces,
            namespaces=list(namespaces),
        )
    finally:
        await state.starts.close()
        await sync.close()
        await worlds.close()
        await client.close()
