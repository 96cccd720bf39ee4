"""``create_webhook()``: a workflow waits on an HTTP callback (issue 13 item 1).

In workflow code::

    hook = create_webhook(signature=HmacSignature(secret_env="SHOP_WEBHOOK_SECRET"))
    await send_to_payment_provider(callback_url=hook.url)
    request = await hook.request()          # a WebhookRequest
    paid = request.body["status"] == "paid"

The hook under it is a ``create_hook()`` hook with a minted token (128 random bits,
taken from the log on every replay), so the URL is the same on every replay: its
base (``TREADLE_PUBLIC_URL``) is recorded in the hook's metadata with the webhook's
response and signature scheme (``treadle.webhookspec``), and a replay builds the URL
from that base and the recorded token (the metadata never holds the token). A POST
to the URL, answered by ``treadle serve`` (``serve.webhooks``), resumes the hook with
the call as a ``WebhookRequest``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Generator
from typing import Any, overload

from pydantic import JsonValue, ValidationError

from treadle import errors, limits, webhookspec
from treadle.sdk import context
from treadle.sdk.durations import Duration, to_seconds
from treadle.sdk.hooks import HookHandle
from treadle.webhookspec import HmacSignature, StripeSignature, WebhookRequest, WebhookResponse

log = logging.getLogger("treadle.webhooks")


class WebhookHandle:
    """A created webhook: give ``url`` to the caller, then ``await hook.request()``
    (or ``await hook``) for the ``WebhookRequest`` it sends."""

    def __init__(self, hook: HookHandle, url: str, run_id: str) -> None:
        self._hook = hook
        self._url = url
        self._run_id = run_id

    @property
    def url(self) -> str:
        """``TREADLE_PUBLIC_URL/hooks/<run id>.<token>``: the same on every replay."""
        return self._url

    @property
    def token(self) -> str:
        """The hook's token (``resume_hook(token, ...)`` and the JSON API take it too)."""
        return self._hook.token

    @property
    def run_id(self) -> str:
        return self._run_id

    @overload
    async def request(self) -> WebhookRequest: ...
    @overload
    async def request(self, timeout: Duration) -> WebhookRequest | None: ...

    async def request(self, timeout: Duration | None = None) -> WebhookRequest | None:
        """The call to ``url``; with ``timeout``, None when it passes first (the webhook is
        then disposed: a later call gets 404)."""
        if timeout is None:
            return self._as_request(await self._hook.payload())
        seconds = to_seconds(timeout, what="webhook timeout")
        try:
            data: Any = await asyncio.wait_for(self._hook.payload(), seconds)
        except TimeoutError:
            self._hook.dispose()
            return None
        return self._as_request(data)

    def _as_request(self, payload: Any) -> WebhookRequest:
        try:
            return WebhookRequest.model_validate(payload)
        except ValidationError as exc:
            raise errors.WorkflowError(
                f"run {self._run_id}: the webhook was resumed with a payload that is not a "
                f"webhook call ({exc.error_count()} problem(s), first: {exc.errors()[0]['msg']}); "
                'POST to its URL, or resume_hook(token, {"body": ...})'
            ) from None

    def __await__(self) -> Generator[Any, None, WebhookRequest]:
        return self.request().__await__()

    def dispose(self) -> None:
        """Stop taking calls now (a later call gets 404)."""
        self._hook.dispose()


def create_webhook(
    *,
    respond_with: WebhookResponse | None = None,
    signature: HmacSignature | StripeSignature | None = None,
    metadata: JsonValue = None,
) -> WebhookHandle:
    """Create a webhook in workflow code: a hook resumed by a POST to ``handle.url``.

    ``respond_with``: the static answer every accepted call gets (default 202
    ``{"accepted": true}``; a 2xx). ``signature``: refuse (401, nothing recorded) a call
    whose HMAC does not verify with the secret in serve's environment variable
    ``secret_env`` (``HmacSignature``: GitHub's ``sha256=<hex>`` of the raw body;
    ``StripeSignature``: ``t=...,v1=...`` with a timestamp tolerance). The URL needs
    ``TREADLE_PUBLIC_URL`` on the worker; without it ``url`` is the bare path.
    """
    replay = context.require_replay("create_webhook()")
    active = limits.active()
    # The hook is created first: its token (minted, or the log's on replay) makes the URL.
    hook_op = replay.create_hook(None, None, namespace=active.hook_token_namespace)
    recorded = webhookspec.spec_of(replay.recorded_hook_metadata(hook_op))
    if recorded is not None:
        base = recorded.base_url
    else:
        base = active.public_url or ""
        if not base:
            log.warning(
                "run %s: TREADLE_PUBLIC_URL is not set; the webhook's url is a bare path",
                replay.run_id,
            )
    url = webhookspec.url(base, replay.run_id, hook_op.token)
    spec = webhookspec.WebhookSpec(
        base_url=base, respond=respond_with or WebhookResponse(), signature=signature
    )
    hook_op.metadata = webhookspec.wrap_metadata(spec, metadata)
    limits.check_value(hook_op.metadata, "webhook options (respond_with, metadata)")
    handle = HookHandle(hook_op)
    if handle.conflict() is not None:  # a minted token never conflicts; say so if it did
        raise errors.WorkflowError(f"run {replay.run_id}: a webhook's minted token conflicted")
    return WebhookHandle(handle, url, replay.run_id)
