"""A webhook call's body, read under a size limit, and the ``WebhookRequest`` it becomes.

``read_body`` refuses a body over ``TREADLE_WEBHOOK_MAX_BODY_BYTES`` from its
Content-Length before reading a byte, and again while it streams (a chunked body, or
a Content-Length that lies), raising ``WebhookBodyTooLarge`` with nothing recorded.
``to_request`` parses it by media type: JSON (``application/json``, ``*+json``) into
``body``, ``application/x-www-form-urlencoded`` into ``form``, other UTF-8 into
``text`` and anything else into ``body_base64``; ``multipart/form-data`` is refused
(415): a webhook carries no file uploads. Malformed input is ``WebhookRequestInvalid``.

Called by ``treadle.serve.webhooks``.
"""

from __future__ import annotations

import base64
import json
import urllib.parse

from starlette.requests import Request

from treadle import clock, errors
from treadle.webhookspec import WebhookRequest


async def read_body(request: Request, limit: int, run_id: str) -> bytes:
    """The raw body, at most ``limit`` bytes."""
    check_declared_length(request, limit, run_id)
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise errors.WebhookBodyTooLarge(run_id=run_id, limit=limit)
        chunks.append(chunk)
    return b"".join(chunks)


def check_declared_length(request: Request, limit: int, run_id: str) -> None:
    declared = request.headers.get("content-length")
    if declared is None:
        return
    if not declared.strip().isdigit():
        raise errors.WebhookRequestInvalid(
            f"Content-Length {declared[:20]!r} is not a number", run_id=run_id
        )
    if int(declared) > limit:
        raise errors.WebhookBodyTooLarge(run_id=run_id, limit=limit, size=int(declared))


def headers_of(request: Request) -> dict[str, str]:
    """Lower-cased names; a repeated header's values joined with ``", "`` (RFC 9110)."""
    out: dict[str, str] = {}
    for raw_name, raw_value in request.headers.raw:
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def to_request(
    request: Request, *, path: str, body: bytes, headers: dict[str, str], run_id: str
) -> WebhookRequest:
    """The typed request the workflow receives."""
    content_type = headers.get("content-type")
    media = (content_type or "").split(";", 1)[0].strip().lower()
    fields: dict[str, object] = {}
    if not body:
        pass
    elif media == "application/json" or media.endswith("+json"):
        fields["body"] = _json(body, run_id)
    elif media == "application/x-www-form-urlencoded":
        fields["form"] = _form(body, run_id)
    elif media.startswith("multipart/"):
        raise errors.WebhookRequestInvalid(
            f"media type {media} is not taken (send JSON, a urlencoded form or text)",
            run_id=run_id,
            status=415,
        )
    else:
        try:
            fields["text"] = body.decode("utf-8")
        except UnicodeDecodeError:
            fields["body_base64"] = base64.b64encode(body).decode("ascii")
    return WebhookRequest.model_validate(
        {
            "method": request.method,
            "path": path,
            "headers": headers,
            "query": _multi(urllib.parse.parse_qsl(request.url.query, keep_blank_values=True)),
            "content_type": content_type,
            "received_at": clock.utcnow(),
            **fields,
        }
    )


def _json(body: bytes, run_id: str) -> object:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise errors.WebhookRequestInvalid(
            f"the body is not valid JSON ({exc})", run_id=run_id
        ) from None
    except RecursionError:
        raise errors.WebhookRequestInvalid(
            "the body's JSON nests too deep", run_id=run_id
        ) from None


def _form(body: bytes, run_id: str) -> dict[str, list[str]]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise errors.WebhookRequestInvalid("the form is not UTF-8", run_id=run_id) from None
    try:
        pairs = urllib.parse.parse_qsl(
            text, keep_blank_values=True, strict_parsing=True, errors="strict"
        )
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.WebhookRequestInvalid(
            f"the form does not parse ({exc})", run_id=run_id
        ) from None
    return _multi(pairs)


def _multi(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, value in pairs:
        out.setdefault(key, []).append(value)
    return out
