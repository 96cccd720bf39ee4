"""``treadle operator``: run the operator until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence

import kopf

from treadle_operator import handlers, kube, leader, mirrored, secretcache, webhook, worldhosts
from treadle_operator.errors import LeadershipLost
from treadle_operator.probes import Probes
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
    sync = StatusSync(client, interval=settings.TREADLE_OPERATOR_STATUS_INTERVAL_SECONDS)
    worlds = Worlds(
        client,
        on_opened=sync.listen,
        on_replaced=sync.repoint,
        allowed_hosts=worldhosts.parse(settings.TREADLE_OPERATOR_WORLD_HOSTS),
    )
    state = State(
        settings=settings, kube=client, worlds=worlds, sync=sync, namespaces=tuple(namespaces)
    )

    sync.on_new_run = functools.partial(mirrored.mirror, state)
    sync.mirrors = functools.partial(mirrored.mirrors, state)
    registry = handlers.build_registry(state)
    elector = _elector(client, settings)
    # The admission webhook answers on every replica, before kopf (and any leadership).
    admission_server = await webhook.serve(state)
    probes = None
    if settings.TREADLE_OPERATOR_PROBE_PORT:
        # A standby is ready: it serves the webhook and takes over when the leader goes, and
        # a RollingUpdate (the new pod a standby first) must not wait for it to lead.
        standby = (lambda: not elector.leading) if elector is not None else None
        probes = Probes(
            state,
            settings.TREADLE_OPERATOR_PROBE_HOST,
            settings.TREADLE_OPERATOR_PROBE_PORT,
            standby=standby,
        )
        await probes.start()
    try:
        if elector is not None:
            await elector.acquire()
        log.info(
            "treadle operator serving %s",
            ", ".join(namespaces) if namespaces else "every namespace",
        )
        await _serve(registry, namespaces, elector, probes.kopf_ready if probes else None)
    finally:
        if elector is not None:
            await elector.release()
        if admission_server is not None:
            await admission_server.stop()
        if probes is not None:
            await probes.stop()
        await state.starts.close()
        await sync.close()
        await worlds.close()
        await client.close()


def _elector(client: kube.Kube, settings: OperatorSettings) -> leader.LeaderElector | None:
    if not settings.TREADLE_OPERATOR_LEADER_ELECTION:
        return None
    namespace = leader.lease_namespace(settings.TREADLE_OPERATOR_LEASE_NAMESPACE)
    if namespace is None:
        log.warning(
            "no namespace for the leader Lease (TREADLE_OPERATOR_LEASE_NAMESPACE, POD_NAMESPACE): "
            "running without leader election; run one operator process only"
        )
        return None
    config = leader.LeaseConfig(
        namespace=namespace,
        name=settings.TREADLE_OPERATOR_LEASE_NAME,
        identity=leader.identity(),
        lease_duration=settings.TREADLE_OPERATOR_LEASE_DURATION_SECONDS,
        renew_deadline=settings.TREADLE_OPERATOR_RENEW_DEADLINE_SECONDS,
        retry_period=settings.TREADLE_OPERATOR_RETRY_PERIOD_SECONDS,
    )
    return leader.LeaderElector(client.api, config)


async def _serve(
    registry: kopf.OperatorRegistry,
    namespaces: Sequence[str],
    elector: leader.LeaderElector | None,
    ready_flag: asyncio.Event | None,
) -> None:
    """kopf until it stops (a signal), or until the Lease is lost (then it is stopped)."""
    stop = asyncio.Event()
    serving = asyncio.ensure_future(
        kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            stop_flag=stop,
            ready_flag=ready_flag,
        )
    )
    if elector is None:
        await serving
        return
    holding = asyncio.ensure_future(elector.hold())
    try:
        await asyncio.wait({serving, holding}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        holding.cancel()
    if serving.done():
        serving.result()
        return
    stop.set()  # the Lease is lost: no handler may act any more
    await serving
    raise LeadershipLost(
        f"{elector.config.identity} lost the leader Lease: stopped serving (a standby takes over)"
    )
