"""treadle serve: ``POST /hooks/<run id>.<token>[/anything]`` resumes a webhook (issue 13).

A webhook (``treadle.sdk.webhooks.create_webhook``) is a hook whose metadata holds a
``WebhookSpec``. A call, in this order, and nothing is recorded before the last step:

1. anything but POST: 405 (``Allow: POST``); a path that is no webhook URL: 404;
2. Content-Length over ``TREADLE_WEBHOOK_MAX_BODY_BYTES``: 413;
3. the live hook (``webhooklookup.find_live``): none is 404, one that already took
   its payload 409 (the run's log says which); a plain ``create_hook`` hook: 404;
4. the body, streamed under the same limit: 413 past it;
5. the signature the webhook chose (``treadle.webhooksig``, secret from serve's
   environment variable ``secret_env``): 401 naming the problem; an unset variable
   is 500 (serve's configuration, said in the log);
6. the ``WebhookRequest`` (``webhookbody.to_request``): 400/415 for a body it cannot read;
7. ``Workflows.resume_found_hook``: the payload and the run's wake; then the
   webhook's response (default 202 ``{"accepted": true}``). A concurrent second call
   that loses the write is 409. A payload recorded whose wake failed is still
   answered as accepted (the run sees it on its next delivery).

No bearer auth: the unguessable token (and the optional HMAC) is the credential.
Errors are ``{"error": {"code", "message"}}`` (PLAN.md's serve contract); log lines
name the run id and never the whole token.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from treadle import clock, errors, webhooksig, webhookspec
from treadle.serve import http, webhookbody, webhooklookup
from treadle.serve.context import ServeContext
from treadle.webhookspec import WebhookSpec

log = logging.getLogger("treadle.serve.webhooks")

ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def routes(ctx: ServeContext) -> list[BaseRoute]:
    handler = WebhookHandler(ctx)
    return [
        Route("/hooks/{token}", handler.handle, methods=ALL_METHODS),
        Route("/hooks/{token}/{rest:path}", handler.handle, methods=ALL_METHODS),
    ]


def error(status: int, code: str, message: str, **headers: str) -> JSONResponse:
    return http.json_error(status, code, message, headers=headers)


class WebhookHandler:
    def __init__(self, ctx: ServeContext) -> None:
        self.ctx = ctx
        self.limit = ctx.settings.TREADLE_WEBHOOK_MAX_BODY_BYTES
        self.namespace = ctx.settings.TREADLE_HOOK_TOKEN_NAMESPACE

    async def handle(self, request: Request) -> Response:
        if request.method != "POST":
            return error(405, "method_not_allowed", "a webhook takes POST only", Allow="POST")
        parsed = webhookspec.parse_path_token(request.path_params["token"])
        if parsed is None:
            return error(404, "hook_not_found", "no webhook at this URL")
        run_id, token = parsed
        rest = request.path_params.get("rest")
        try:
            return await self._accept(request, run_id, token, f"/{rest}" if rest else "")
        except errors.TreadleError as exc:
            return self._refused(exc, run_id, token)
        except ClientDisconnect:
            log.info("run %s: the webhook's caller went before its body arrived", run_id)
            return error(400, "request_invalid", "the request ended before its body did")
        except Exception:  # a storage or queue failure: a JSON 503, never a stack trace
            log.exception("run %s: webhook call failed", run_id)
            return error(503, "storage_unavailable", "the webhook could not be recorded; retry")

    async def _accept(self, request: Request, run_id: str, token: str, path: str) -> Response:
        webhookbody.check_declared_length(request, self.limit, run_id)
        hook = await webhooklookup.find_live(self.ctx.world, run_id, token, self.namespace)
        spec = webhookspec.spec_of(hook.metadata)
        if spec is None:  # a create_hook() hook: never resumed from a public URL
            raise errors.HookNotFound(token, run_id=run_id)
        body = await webhookbody.read_body(request, self.limit, run_id)
        headers = webhookbody.headers_of(request)
        self._verify(spec, headers, body, token, run_id)
        model = webhookbody.to_request(
            request, path=path, body=body, headers=headers, run_id=run_id
        )
        try:
            await self.ctx.client.resume_found_hook(token, hook, model)
        except errors.HookWakeFailed as exc:
            log.warning(
                "run %s: webhook payload recorded, wake not sent: %s", run_id, _hide(exc, token)
            )
        except errors.HookNotFound:
            # Another call took the payload (or the hook went) between lookup and write.
            found = await webhooklookup.state_in_log(self.ctx.world, run_id, token)
            raise webhooklookup.refusal(found, token, run_id) from None
        log.info("run %s: webhook call accepted (%d bytes)", run_id, len(body))
        return _response(spec)

    def _verify(
        self, spec: WebhookSpec, headers: dict[str, str], body: bytes, token: str, run_id: str
    ) -> None:
        scheme = spec.signature
        if scheme is None:
            return
        secret = os.environ.get(scheme.secret_env, "")
        if not secret:
            raise errors.WebhookSecretMissing(scheme.secret_env, run_id=run_id)
        webhooksig.verify(
            scheme, headers, body, secret, now=clock.now(), token=token, run_id=run_id
        )

    def _refused(self, exc: errors.TreadleError, run_id: str, token: str) -> Response:
        status, code = _status_of(exc)
        level = logging.ERROR if status >= 500 else logging.INFO
        message = exc.message if isinstance(exc, errors.RequestRefused) else _hide(exc, token)
        log.log(level, "run %s: webhook call refused (%d %s): %s", run_id, status, code, message)
        if isinstance(exc, errors.HookNotFound) and not isinstance(
            exc, errors.WebhookAlreadyReceived
        ):
            message = "no live webhook at this URL (never created, disposed, or its run ended)"
        elif status >= 500 and not isinstance(
            exc, errors.WebhookSecretMissing | errors.WebhookSpecUnreadable
        ):
            message = f"the webhook could not be recorded ({type(exc).__name__}); retry later"
        return error(status, code, message)


def _hide(exc: BaseException, token: str) -> str:
    """The error's message with the token cut to its first characters (the token is the
    URL's secret; a message may quote it whole, as HookNotFound's does)."""
    return str(exc).replace(token, errors.shown_token(token))


def _status_of(exc: errors.TreadleError) -> tuple[int, str]:
    if isinstance(exc, errors.RequestRefused):  # serve's own body limit, while streaming
        return exc.status, exc.code
    if isinstance(exc, errors.WebhookAlreadyReceived):
        return 409, "hook_already_received"
    if isinstance(exc, errors.HookNotFound | errors.RunNotFound | errors.RunExpired):
        return 404, "hook_not_found"
    if isinstance(exc, errors.WebhookBodyTooLarge):
        return 413, "body_too_large"
    if isinstance(exc, errors.WebhookSignatureInvalid):
        return 401, "signature_invalid"
    if isinstance(exc, errors.WebhookSecretMissing):
        return 500, "signature_secret_missing"
    if isinstance(exc, errors.WebhookSpecUnreadable):
        return 500, "webhook_unreadable"
    if isinstance(exc, errors.WebhookRequestInvalid):
        return exc.status, "request_invalid" if exc.status == 400 else "unsupported_media_type"
    if isinstance(exc, errors.ValueLimitExceeded):
        return 413, "value_too_large"
    if isinstance(exc, errors.SerializationError):
        return 422, "value_invalid"
    if isinstance(exc, errors.RunNotSupported):
        return 409, "run_not_supported"
    return 503, "storage_unavailable"


def _response(spec: WebhookSpec) -> Response:
    chosen = spec.respond
    body: Any = chosen.body
    if isinstance(body, str):
        return PlainTextResponse(body, chosen.status, headers=chosen.headers)
    return JSONResponse(body, chosen.status, headers=chosen.headers)
