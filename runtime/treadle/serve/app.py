"""The ``treadle serve`` ASGI app: every module's routes on one Starlette app.

``create_app(ctx)`` is what tests mount (with a real World and a real HTTP server);
``serve`` runs it under uvicorn for the CLI. Owned by the API work; the other
modules only add their ``routes(ctx)`` here.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.routing import BaseRoute

import treadle.serve.metricsroute as metricsroute
from treadle.serve import api, inspector, webhooks
from treadle.serve.context import ServeContext


def create_app(ctx: ServeContext) -> Starlette:
    routes: list[BaseRoute] = []
    routes += webhooks.routes(ctx)
    routes += api.routes(ctx)
    routes += inspector.routes(ctx)
    routes += metricsroute.routes(ctx)
    return Starlette(routes=routes)
