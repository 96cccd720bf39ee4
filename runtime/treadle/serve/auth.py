"""Who may call ``treadle serve``: bearer tokens with two roles, or a trusted proxy header.

- ``TREADLE_SERVE_TOKEN``: ``Authorization: Bearer <token>`` gets the full role
  (reads and actions); ``TREADLE_SERVE_READONLY_TOKEN`` the read-only role (GET and
  HEAD only: any other method is 403 ``read_only``). Compared in constant time.
- ``TREADLE_SERVE_TRUSTED_HEADER`` (e.g. ``X-Forwarded-User``): a request carrying it
  is the user an authenticating proxy vouches for: read-only, unless the user is in
  ``TREADLE_SERVE_TRUSTED_FULL_USERS`` (or that is ``*``). Only safe behind a proxy
  that sets the header itself and strips it from what clients send.
- ``?access_token=<token>`` is read on the stream routes only (``/api/stream``,
  ``/api/runs/{run_id}/stream``, ``/api/runs/{run_id}/streams/{name}``: an
  EventSource cannot send headers); anywhere else
  it is refused (401), so tokens do not end up in ordinary URLs and access logs.
- Public, without credentials: ``/healthz``, the webhooks (``/hooks/...``: their
  token and signature are their auth), the page's static shell (``/``, ``/runs/...``,
  ``/static/...``), and ``/metrics`` unless ``TREADLE_SERVE_METRICS_AUTH``.
- No credentials: 401 ``unauthorized`` with ``WWW-Authenticate: Bearer``; a wrong
  token: 401 ``bad_credentials``. Tokens are never logged or echoed.

``AuthMiddleware`` is installed by ``app.create_app``; routes read the caller with
``principal(request)``.
"""

from __future__ import annotations

import hmac
import logging
import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from treadle.serve import http
from treadle.serve.settings import ServeSettings

log = logging.getLogger("treadle.serve.auth")

Role = Literal["full", "read"]
SAFE_METHODS = frozenset({"GET", "HEAD"})

# Answer without credentials (the contract of PLAN.md; a module adding a public page
# appends here).
PUBLIC_PATHS: frozenset[str] = frozenset({"/healthz", "/", "/favicon.ico"})
PUBLIC_PREFIXES: tuple[str, ...] = ("/hooks/", "/static/", "/runs/")
METRICS_PATH = "/metrics"
# Issue 17 item 6: a run stream's chunks (/api/runs/{run_id}/streams/{name}) too.
STREAM_PATH = re.compile(r"/api/(?:runs/[^/]+/)?stream|/api/runs/[^/]+/streams/[^/]+")
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="treadle"'}


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller: its role, how it was authenticated, and the proxy's user if any."""

    role: Role
    via: Literal["token", "proxy", "insecure"]
    user: str | None = None

    @property
    def may_act(self) -> bool:
        return self.role == "full"


_TOKEN_IN_PATH = re.compile(r"^(/api/hooks/|/hooks/)[^?]*?(?=/resume(?:$|\?)|$|\?)")
_TOKEN_IN_QUERY = re.compile(r"(access_token=)[^&\s]*")


def redact_path(path: str) -> str:
    """A request path (and query) as a log line may show it: hook tokens (which resume a
    hook) and ``access_token`` values replaced by ``<redacted>``."""
    path = _TOKEN_IN_PATH.sub(lambda m: m.group(1) + "<redacted>", path)
    return _TOKEN_IN_QUERY.sub(r"\1<redacted>", path)


class RedactingFilter(logging.Filter):
    """For uvicorn's access log (``treadle serve --access-log``): paths through
    ``redact_path``, so tokens in URLs never reach a log line."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple):
            record.args = tuple(redact_path(a) if isinstance(a, str) else a for a in args)
        return True


def is_public(path: str, settings: ServeSettings) -> bool:
    if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
        return True
    return path == METRICS_PATH and not settings.TREADLE_SERVE_METRICS_AUTH


def is_stream(path: str) -> bool:
    return STREAM_PATH.fullmatch(path) is not None


def principal(request: Request) -> Principal | None:
    """The authenticated caller of ``request`` (None on a public route)."""
    found = request.scope.get("treadle.principal")
    return found if isinstance(found, Principal) else None


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class Authenticator:
    """Decides who a request is, from the settings read once at start."""

    def __init__(self, settings: ServeSettings, *, insecure: bool = False) -> None:
        self.settings = settings
        self.insecure = insecure
        self._full = (settings.full_token() or "").encode() or None
        self._read = (settings.readonly_token() or "").encode() or None
        header = settings.TREADLE_SERVE_TRUSTED_HEADER
        self._header = header.lower().encode() if header else None
        self._full_users = settings.trusted_full_users

    def _token_role(self, token: str) -> Role | None:
        given = token.encode()
        # Both compared every time, in constant time for equal lengths.
        full = self._full is not None and hmac.compare_digest(given, self._full)
        read = self._read is not None and hmac.compare_digest(given, self._read)
        return "full" if full else "read" if read else None

    def authenticate(self, scope: Scope) -> Principal:
        path: str = scope["path"]
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        authorization = [v for k, v in headers if k == b"authorization"]
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        query_token = query.get("access_token")
        if query_token is not None and not is_stream(path):
            raise Refused(
                401,
                "bad_credentials",
                "access_token in the URL is accepted on the stream routes only "
                "(/api/stream, /api/runs/{run_id}/stream); send Authorization: Bearer",
            )
        token: str | None = None
        if authorization:
            scheme, _, value = authorization[0].decode("latin-1").partition(" ")
            if scheme.lower() != "bearer" or not value.strip():
                raise Refused(
                    401, "bad_credentials", "the Authorization header must be: Bearer <token>"
                )
            token = value.strip()
        elif query_token:
            token = query_token[0]
        if token is not None:
            role = self._token_role(token)
            if role is None:
                raise Refused(401, "bad_credentials", "the bearer token is not valid")
            return Principal(role=role, via="token")
        if self._header is not None:
            users = [v for k, v in headers if k == self._header]
            user = users[0].decode("utf-8", "replace").strip() if users else ""
            if user:
                full = "*" in self._full_users or user in self._full_users
                return Principal(role="full" if full else "read", via="proxy", user=user)
        if self.insecure:
            return Principal(role="full", via="insecure")
        proxy = self.settings.TREADLE_SERVE_TRUSTED_HEADER
        through = f" (or come through the proxy that sets {proxy})" if proxy else ""
        raise Refused(
            401,
            "unauthorized",
            f"credentials required: send Authorization: Bearer <token>{through}",
        )


class AuthMiddleware:
    """Refuses every non-public request without credentials, and actions of the read role."""

    def __init__(self, app: ASGIApp, authenticator: Authenticator) -> None:
        self.app = app
        self.auth = authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_public(scope["path"], self.auth.settings):
            await self.app(scope, receive, send)
            return
        method: str = scope["method"]
        try:
            who = self.auth.authenticate(scope)
        except Refused as exc:
            log.info("refused %s %s: %s", method, redact_path(scope["path"]), exc.code)
            headers = CHALLENGE if exc.status == 401 else None
            await http.send_error(send, exc.status, exc.code, exc.message, headers)
            return
        if not who.may_act and method not in SAFE_METHODS:
            await http.send_error(
                send,
                403,
                "read_only",
                f"{method} {scope['path']} needs the full role; these credentials are read-only",
            )
            return
        scope["treadle.principal"] = who
        await self.app(scope, receive, send)
