"""The ``treadle serve`` ASGI app: every module's routes on one Starlette app.

``create_app(ctx)`` is what tests mount (with a real World and a real HTTP server);
``Server`` runs it under uvicorn (the CLI's ``treadle serve`` and the test fixture
both use it). Owned by the API work; the other modules only add their
``routes(ctx)`` here.

Why Starlette and not FastAPI: our pydantic models are already at every boundary,
and Starlette is the small core FastAPI stands on; the OpenAPI document is written
from those models (``serve.openapi``), with no second framework's conventions.

Layers, outermost first: CORS (only when ``TREADLE_SERVE_CORS_ORIGINS`` opens it),
the body limit (413 before reading), auth (401/403 before any route), then the
routes; every error on the way out is the JSON shape of ``serve.http``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

import treadle.serve.metricsroute as metricsroute
from treadle import errors
from treadle.serve import api, http, inspector, webhooks
from treadle.serve.auth import Authenticator, AuthMiddleware, RedactingFilter, redact_path
from treadle.serve.bodylimit import BodyLimitMiddleware
from treadle.serve.context import ServeContext

log = logging.getLogger("treadle.serve")

# How long a stopping server lets open requests finish before it cancels them.
GRACE_SECONDS = 5.0
STARTUP_TIMEOUT_SECONDS = 30.0


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


def _treadle_error(request: Request, exc: Exception) -> Response:
    refusal = http.refusal_for(exc)
    if refusal is None:
        return _unexpected(request, exc)
    status, code, message = refusal
    return http.json_error(status, code, message)


def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return http.json_error(404, "not_found", f"no route {request.method} {request.url.path}")
    if exc.status_code == 405:
        return http.json_error(
            405,
            "method_not_allowed",
            f"{request.method} is not allowed on {request.url.path}",
            headers=exc.headers,
        )
    return http.json_error(exc.status_code, "http_error", str(exc.detail), headers=exc.headers)


def _unexpected(request: Request, exc: Exception) -> Response:
    log.error(
        "unexpected %s on %s %s", type(exc).__name__, request.method,
        redact_path(request.url.path), exc_info=exc,
    )  # fmt: skip
    return http.json_error(
        500, "internal", f"unexpected {type(exc).__name__}; the server logged it"
    )


def create_app(ctx: ServeContext) -> Starlette:
    """The app over ``ctx``; ``SettingsError`` when no auth is configured (and not insecure)."""
    if not ctx.serve.auth_configured and not ctx.insecure_no_auth:
        raise errors.SettingsError(
            "treadle serve needs auth: set TREADLE_SERVE_TOKEN (and/or "
            "TREADLE_SERVE_READONLY_TOKEN) or TREADLE_SERVE_TRUSTED_HEADER, or pass "
            "--insecure-no-auth on a machine only you can reach"
        )
    routes: list[BaseRoute] = [Route("/healthz", healthz, methods=["GET"])]
    routes += webhooks.routes(ctx)
    routes += api.routes(ctx)
    routes += inspector.routes(ctx)
    routes += metricsroute.routes(ctx)
    middleware: list[Middleware] = []
    origins = ctx.serve.cors_origins
    if origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=origins,
                allow_methods=["GET", "POST"],
                allow_headers=["Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID"],
            )
        )
    middleware.append(Middleware(BodyLimitMiddleware, limit=ctx.serve.TREADLE_SERVE_MAX_BODY_BYTES))
    # Insecure only where nothing is configured: a token set means the token is asked.
    insecure = ctx.insecure_no_auth and not ctx.serve.auth_configured
    authenticator = Authenticator(ctx.serve, insecure=insecure)
    middleware.append(Middleware(AuthMiddleware, authenticator=authenticator))
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={
            errors.TreadleError: _treadle_error,
            HTTPException: _http_error,
            Exception: _unexpected,
        },
    )


class _Uvicorn(uvicorn.Server):
    """uvicorn, telling the app it stops before it waits on open streams."""

    def __init__(self, config: uvicorn.Config, ctx: ServeContext, *, signals: bool) -> None:
        super().__init__(config)
        self._ctx = ctx
        self._signals = signals

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if self._signals:
            with super().capture_signals():
                yield
        else:
            yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._ctx.stopping.set()
        await super().shutdown(sockets)


class Server:
    """``create_app(ctx)`` under uvicorn on ``host:port`` (0: an ephemeral port).

    ``await start()`` returns once it listens (``port`` is then the bound one);
    ``await stop()`` ends the streams, lets requests finish (``GRACE_SECONDS``) and
    returns. ``await run()`` serves until SIGINT/SIGTERM (``signals=True``).
    """

    def __init__(
        self,
        ctx: ServeContext,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        signals: bool = False,
        log_level: str = "warning",
        access_log: bool = False,
    ) -> None:
        self.ctx = ctx
        self.app = create_app(ctx)
        config = uvicorn.Config(
            self.app,
            host=host,
            port=port,
            lifespan="off",
            log_level=log_level,
            access_log=access_log,
            server_header=False,
            timeout_graceful_shutdown=int(GRACE_SECONDS),
        )
        if access_log:
            access = logging.getLogger("uvicorn.access")
            if not any(isinstance(f, RedactingFilter) for f in access.filters):
                access.addFilter(RedactingFilter())
        self._server = _Uvicorn(config, ctx, signals=signals)
        self._task: asyncio.Task[None] | None = None
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def _serve(self) -> None:
        try:
            await self._server.serve()
        except SystemExit:  # uvicorn exits when it cannot bind (it logged why)
            raise errors.SettingsError(f"treadle serve could not listen on {self.url}") from None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._serve(), name="treadle-serve")
        deadline = asyncio.get_running_loop().time() + STARTUP_TIMEOUT_SECONDS
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it did not start
                raise errors.SettingsError(f"treadle serve could not listen on {self.url}")
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"treadle serve did not start in {STARTUP_TIMEOUT_SECONDS} s")
            await asyncio.sleep(0.01)
        bound = self._server.servers[0].sockets[0].getsockname()
        self.port = int(bound[1])

    def request_stop(self) -> None:
        """Begin a graceful stop (safe from a signal handler); ``wait`` returns after it."""
        self._server.should_exit = True

    async def wait(self) -> None:
        """Until the server has stopped (``request_stop``, or uvicorn's own signals)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def stop(self) -> None:
        self.request_stop()
        if self._task is not None:
            await self._task
            self._task = None

    async def run(self) -> None:
        """Serve until stopped (a signal, with ``signals=True``)."""
        await self._serve()
