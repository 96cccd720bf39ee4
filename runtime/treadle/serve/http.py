"""HTTP plumbing every serve module shares: the JSON error shape and reading requests.

Every error ``treadle serve`` answers is ``{"error": {"code": ..., "message": ...}}``
with its 4xx (or 5xx) status, never a stack trace (issue 13, "Bad input"). Routes
raise ``errors.RequestRefused`` (or let a treadle error through: ``refusal_for``
maps the World's refusals); ``app.create_app`` installs the handlers. ``read_json``
parses a body into a pydantic model (400 malformed, 422 naming the field);
``query`` parses query parameters the same way. Used by api, webhooks and inspector.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Send

from treadle import errors

log = logging.getLogger("treadle.serve")

M = TypeVar("M", bound=BaseModel)


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def json_error(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(code, message), status_code=status, headers=headers)


async def send_error(
    send: Send, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> None:
    """The JSON error straight on an ASGI ``send`` (for middleware, before any route)."""
    body = json.dumps(error_body(code, message)).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


# A treadle error a route lets through: its status and code (the message is the error's).
_REFUSALS: tuple[tuple[type[BaseException], int, str], ...] = (
    (errors.RequestRefused, 400, "bad_request"),  # its own status and code win (refusal_for)
    (errors.RunNotFound, 404, "run_not_found"),
    (errors.HookNotFound, 404, "hook_not_found"),
    (errors.StepNotFound, 404, "step_not_found"),
    (errors.HookSignatureInvalid, 403, "hook_signature_invalid"),
    (errors.RunExpired, 409, "run_ended"),
    (errors.RunNotSupported, 409, "run_format_unknown"),
    (errors.DeploymentRetired, 409, "deployment_retired"),
    (errors.WorkflowNotFound, 404, "workflow_not_found"),
    (errors.ValueLimitExceeded, 413, "value_too_large"),
    (errors.PayloadKeyMissing, 409, "payload_key_missing"),
    (errors.SerializationError, 422, "invalid_value"),
    (errors.HookPayloadNotRecorded, 503, "not_recorded"),
    (errors.HookWakeFailed, 503, "wake_not_sent"),
    (errors.StorageUnavailable, 503, "world_unavailable"),
    (errors.SettingsError, 500, "bad_setting"),
)


def refusal_for(exc: BaseException) -> tuple[int, str, str] | None:
    """``(status, code, message)`` for an error that is the caller's or the World's, or None."""
    if isinstance(exc, errors.RequestRefused):
        return exc.status, exc.code, exc.message
    for kind, status, code in _REFUSALS:
        if isinstance(exc, kind):
            return status, code, " ".join(str(exc).split())
    return None


def _field_problems(exc: ValidationError, where: str) -> str:
    parts = []
    for e in exc.errors()[:5]:
        loc = ".".join(str(p) for p in e["loc"]) or where
        parts.append(f"{loc}: {e['msg']}")
    more = len(exc.errors()) - 5
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def parse_model(model: type[M], data: Any, where: str) -> M:
    """``data`` validated as ``model``; a 422 ``invalid_field`` naming each bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise errors.RequestRefused(
            422, "invalid_field", f"{where}: {_field_problems(exc, where)}"
        ) from None


async def read_json(request: Request, model: type[M], *, empty: Any = None) -> M:
    """The request body parsed as JSON into ``model``.

    An empty body is ``empty`` (``None``: the model from ``{}``); a body that is not
    JSON is 400 ``malformed_json`` naming where it breaks; a value the model refuses
    is 422 ``invalid_field`` naming the field. A body past the size limit is 413
    (raised by the body limit while reading).
    """
    raw = await request.body()
    if not raw.strip():
        return parse_model(model, {} if empty is None else empty, "body")
    try:
        data = json.loads(raw)
    except UnicodeDecodeError:
        raise errors.RequestRefused(400, "malformed_json", "the body is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise errors.RequestRefused(
            400,
            "malformed_json",
            f"the body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
        ) from None
    except RecursionError:
        raise errors.RequestRefused(400, "malformed_json", "the body nests too deep") from None
    except ValueError as exc:  # an integer past Python's digit limit
        raise errors.RequestRefused(
            400, "malformed_json", f"the body cannot be read: {exc}"
        ) from None
    return parse_model(model, data, "body")


def query(request: Request, model: type[M]) -> M:
    """The query parameters as ``model`` (each given once); 422 naming a bad one."""
    params = request.query_params
    data: dict[str, Any] = {}
    for key in params:
        values = params.getlist(key)
        if len(values) > 1:
            raise errors.RequestRefused(
                422, "invalid_field", f"query parameter {key!r} is given {len(values)} times"
            )
        data[key] = values[0]
    known = set(model.model_fields)
    unknown = sorted(set(data) - known - {"access_token"})
    if unknown:
        raise errors.RequestRefused(
            422,
            "invalid_field",
            f"unknown query parameter {unknown[0]!r} (known: {', '.join(sorted(known)) or 'none'})",
        )
    data.pop("access_token", None)
    return parse_model(model, data, "query")
