"""treadle serve: the JSON API's routes (issue 13 item 1), one per ``openapi.OPERATIONS``.

The handlers live by concern: reads in ``runsapi``, actions in ``actions``, the
server-sent events in ``stream``; each takes ``(ctx, request)`` and returns a
``serve.models`` response (or ``(status, model)``), which is answered as JSON here.
Errors are raised (``errors.RequestRefused`` or a treadle error) and answered by
``app.create_app``'s handlers as ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from treadle.serve import actions, openapi, runsapi, stream, streamsapi
from treadle.serve.context import ServeContext

Handler = Callable[[ServeContext, Request], Awaitable[Any]]

HANDLERS: dict[str, Handler] = {
    "listRuns": runsapi.list_runs,
    "getRun": runsapi.get_run,
    "listRunEvents": runsapi.run_events,
    "getRunTimeline": runsapi.run_timeline,
    "cancelRun": actions.cancel,
    "wakeRun": actions.wake,
    "rerunRun": actions.rerun,
    "resumeHook": actions.resume_hook,
    "listDeployments": runsapi.list_deployments,
    "streamRun": stream.run_stream,
    "streamRuns": stream.list_stream,
    "listRunStreams": streamsapi.list_streams,  # issue 17 item 6
    "streamRunChunks": streamsapi.stream_chunks,
}
# Served by app.py (health) or here without a handler of the table (the document).
ELSEWHERE = frozenset({"health"})
# Paths as Starlette routes them (a token may hold "/").
ROUTE_PATHS = {"/api/hooks/{token}/resume": "/api/hooks/{token:path}/resume"}


def _answer(result: Any) -> Response:
    if isinstance(result, Response):
        return result
    status = 200
    if isinstance(result, tuple):
        status, result = result
    assert isinstance(result, BaseModel)
    return JSONResponse(result.model_dump(mode="json"), status_code=status)


def _endpoint(ctx: ServeContext, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return _answer(await handler(ctx, request))

    return endpoint


def routes(ctx: ServeContext) -> list[BaseRoute]:
    document = openapi.document()

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(document)

    out: list[BaseRoute] = []
    for op in openapi.OPERATIONS:
        if op.operation_id in ELSEWHERE:
            continue
        path = ROUTE_PATHS.get(op.path, op.path)
        if op.operation_id == "openapi":
            out.append(Route(path, openapi_json, methods=[op.method]))
            continue
        out.append(Route(path, _endpoint(ctx, HANDLERS[op.operation_id]), methods=[op.method]))
    return out
