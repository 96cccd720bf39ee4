"""The request body limit of ``treadle serve`` (``TREADLE_SERVE_MAX_BODY_BYTES``).

A ``Content-Length`` over the limit is answered 413 before a byte of the body is
read; a body without one (chunked) is counted as it is received and refused with
413 (``errors.RequestRefused``, raised from the route's read) as soon as it passes
the limit, so nothing past it is buffered. A ``Content-Length`` that is not a number
is 400. Installed by ``app.create_app`` in front of every route (the webhooks may
refuse smaller bodies on their own).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from treadle import errors
from treadle.serve import http


def too_large(limit: int) -> str:
    return f"the request body is over {limit} bytes (TREADLE_SERVE_MAX_BODY_BYTES)"


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        lengths = [v for k, v in scope.get("headers", []) if k == b"content-length"]
        if lengths:
            try:
                length = int(lengths[0])
            except ValueError:
                await http.send_error(send, 400, "bad_request", "Content-Length is not a number")
                return
            if length > self.limit:
                await http.send_error(send, 413, "too_large", too_large(self.limit))
                return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise errors.RequestRefused(413, "too_large", too_large(self.limit))
            return message

        await self.app(scope, counted, send)
