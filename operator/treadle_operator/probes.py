"""The operator's HTTP endpoints: ``/healthz``, ``/readyz`` and ``/metrics``.

One small aiohttp server (kopf's own dependency) on ``TREADLE_OPERATOR_PROBE_PORT``
(the chart sets 8080 and points its probes and metrics Service there; 0 starts
none), run on the operator's event loop by ``main.run``:

- ``/healthz`` (liveness): 200 while the event loop answers and kopf has not
  stopped; a wedged loop never answers, so the kubelet restarts the pod.
- ``/readyz`` (readiness): 503 until kopf's startup is done (its watches begin
  then) *and* every WorkflowDeployment in the served namespaces has been
  reconciled once since this process started, i.e. its World connection was
  tried and its ``WorldReachable`` recorded (or its spec refused). Once ready
  it stays ready: a World that goes away later is the ``WorldReachable``
  condition and the ``treadle_operator_world_reachable`` metric, not a reason
  to restart or unroute the operator. A standby (leader election on, another
  process holds the Lease) is ready: it serves the admission webhook and is
  ready to take over, and a RollingUpdate must not wait for it to lead.
- ``/metrics``: ``treadle_operator.metrics`` in the Prometheus text format.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from treadle_operator import metrics, models
from treadle_operator.state import State

log = logging.getLogger("treadle.operator.probes")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Probes:
    def __init__(
        self,
        state: State,
        host: str,
        port: int,
        *,
        standby: Callable[[], bool] | None = None,
    ) -> None:
        self.state = state
        self.standby = standby
        self.host = host
        self.port = port
        self.kopf_ready = asyncio.Event()
        self.stopping = False
        self._ready = False
        self._runner: web.AppRunner | None = None
        metrics.TRACKED_RUNS.read = lambda: float(state.sync.count())

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()  # a port taken is an error: the chart's probes point here
        log.info("probes and metrics on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        self.stopping = True
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def healthz(self, _request: web.Request) -> web.Response:
        if self.stopping:
            return web.Response(status=503, text="stopping\n")
        return web.Response(text="ok\n")

    async def readyz(self, _request: web.Request) -> web.Response:
        ready, why = await self.check_ready()
        return web.Response(status=200 if ready else 503, text=why + "\n")

    async def metrics(self, _request: web.Request) -> web.Response:
        body = metrics.exposition()
        return web.Response(body=body.encode(), headers={"Content-Type": CONTENT_TYPE})

    async def check_ready(self) -> tuple[bool, str]:
        if self.stopping:
            return False, "stopping"
        if self._ready:
            return True, "ready"
        if self.standby is not None and self.standby():
            return True, "standby: another process holds the leader Lease"
        if not self.kopf_ready.is_set():
            return False, "kopf is starting"
        try:
            waiting = [d for d in await self._deployments() if not _reconciled(d)]
        except Exception as exc:  # the API server: not ready, said why
            return False, f"cannot list WorkflowDeployments: {exc}"
        if waiting:
            shown = ", ".join(waiting[:5])
            return False, f"{len(waiting)} WorkflowDeployment(s) not reconciled yet: {shown}"
        self._ready = True
        return True, "ready"

    async def _deployments(self) -> list[str]:
        custom = self.state.kube.custom
        found: list[dict[str, Any]] = []
        if self.state.namespaces:
            for namespace in self.state.namespaces:
                listed = await custom.list_namespaced_custom_object(
                    models.GROUP, models.VERSION, namespace, "workflowdeployments"
                )
                found.extend(listed.get("items") or [])
        else:
            listed = await custom.list_cluster_custom_object(
                models.GROUP, models.VERSION, "workflowdeployments"
            )
            found.extend(listed.get("items") or [])
        return [f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in found]


def _reconciled(where: str) -> bool:
    namespace, _, name = where.partition("/")
    return (namespace, name) in metrics.RECONCILED
