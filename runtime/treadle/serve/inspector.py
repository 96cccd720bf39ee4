"""treadle serve: the inspector, a web page over the JSON API (issue 13 item 1).

Owns ``GET /`` and ``GET /runs/{run_id}`` (both answer the same HTML shell; the
page's JavaScript reads the URL and calls ``/api/...``), ``/static/...`` (the
page's ES modules, stylesheet and icon, shipped as package data under
``inspector_static/``: no build step, nothing from a CDN, works offline) and
``GET /inspector/session`` (the caller's role, so the page hides the actions from
a read-only token). ``app.create_app`` mounts ``routes(ctx)``.

The shell and the static files answer without credentials (they hold no data);
the page asks for the bearer token and keeps it in the tab's sessionStorage. Every
response carries a strict Content-Security-Policy: scripts and styles from this
origin only, no inline script, no framing; the page inserts data as text only.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from treadle.serve import auth
from treadle.serve.context import ServeContext

STATIC_DIR = Path(__file__).with_name("inspector_static")
SESSION_PATH = "/inspector/session"

# Sent with the shell and every static file. 'self' only: the JS modules, the CSS
# and the icon come from this server; the API and the SSE streams too.
SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


def _shell() -> bytes:
    return (STATIC_DIR / "index.html").read_bytes()


async def page(request: Request) -> Response:
    """The HTML shell, for ``/`` and for ``/runs/{run_id}`` (the JS picks the view)."""
    del request
    headers = {**SECURITY_HEADERS, "Cache-Control": "no-cache"}
    return Response(_shell(), media_type="text/html; charset=utf-8", headers=headers)


async def session(request: Request) -> Response:
    """The caller's role (``full`` or ``read``) as the auth layer decided it.

    Not a public path: a request without valid credentials never gets here (401).
    """
    who = auth.principal(request)
    body = {"role": "read", "user": None, "via": None}
    if who is not None:
        body = {"role": who.role, "user": who.user, "via": who.via}
    return JSONResponse(body, headers={"Cache-Control": "no-store"})


class _WithHeaders:
    """Adds the security headers (and revalidation) to every static file's answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                for name, value in SECURITY_HEADERS.items():
                    headers.append((name.lower().encode(), value.encode()))
                headers.append((b"cache-control", b"no-cache"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, stamped)


def routes(ctx: ServeContext) -> list[BaseRoute]:
    del ctx
    static = _WithHeaders(StaticFiles(directory=STATIC_DIR))
    return [
        Route("/", page, methods=["GET"]),
        Route("/runs/{run_id}", page, methods=["GET"]),
        Route(SESSION_PATH, session, methods=["GET"]),
        Mount("/static", app=static, name="static"),
    ]
