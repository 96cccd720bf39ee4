"""treadle serve: ``GET /metrics``, Prometheus metrics of this process and its World.

The exposition of ``treadle.metrics`` after a refresh of the World's gauges (open runs
by status, dead letters: ``metrics.world.WorldGauges``, at most one read per 10 s
whatever the scrape rate). The counters of serve's own writes and sends (cancels,
resumes, re-runs) are recorded once ``treadle serve`` turned metrics on
(``telemetry.configure(metrics=True)`` before it opens the World); creating the routes
flips no process-wide switch, so an app built in a test changes nothing else. Public
unless ``TREADLE_SERVE_METRICS_AUTH=1``: the serve app's auth layer decides
(``serve.auth``). Composed into the app by ``serve.app.create_app``.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from treadle import metrics, telemetry
from treadle.metrics.world import WorldGauges
from treadle.serve.context import ServeContext

EXTRA_KEY = "metrics"


def routes(ctx: ServeContext) -> list[BaseRoute]:
    telemetry.instrument(ctx.world)  # a no-op unless telemetry is on (and once)
    gauges = WorldGauges(ctx.world)
    ctx.extras[EXTRA_KEY] = gauges

    async def exposition(request: Request) -> Response:
        await gauges.refresh()
        return Response(metrics.exposition(), media_type=metrics.CONTENT_TYPE)

    return [Route("/metrics", exposition, methods=["GET"])]
