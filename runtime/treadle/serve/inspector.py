"""treadle serve: the inspector routes (issue 13). Stub: filled in on its own branch."""

from __future__ import annotations

from starlette.routing import BaseRoute

from treadle.serve.context import ServeContext


def routes(ctx: ServeContext) -> list[BaseRoute]:
    del ctx
    return []
