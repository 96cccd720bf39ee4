"""Webhooks' shared models: what a webhook stores, what a call becomes (issue 13 item 1).

A webhook is a hook (``treadle.sdk.hooks``) created by ``create_webhook()``: its token
is minted (``hooktokens.mint``: 128 random bits, taken from the log on replay), and
its URL is ``TREADLE_PUBLIC_URL`` + ``/hooks/<run id>.<token>``. The run id in the
path lets ``treadle serve`` tell a hook that already took its payload (409) from one
that never existed or is gone (404): the World forgets a hook's token once its payload
is recorded, but the run's log keeps ``hook_created`` and ``hook_received``.

What the workflow chose (the response, the signature scheme, the URL's base) is kept
in the hook's stored metadata (``wrap_metadata``), so it binds whichever serve replica takes
the call. Never a secret: a signature names the environment variable of serve that
holds it (``secret_env``).

- ``WebhookResponse``: the static answer the caller gets (default 202 ``{"accepted": true}``).
- ``HmacSignature`` (GitHub style, ``sha256=<hex>`` of the raw body) and
  ``StripeSignature`` (``t=<unix>,v1=<hex>`` of ``"<t>.<raw body>"``, with a tolerance).
- ``WebhookSpec``: the three above as stored; ``WebhookRequest``: the typed request the
  awaiting workflow receives.

Imported by ``treadle.sdk.webhooks`` (workflow side), ``treadle.webhooksig`` and
``treadle.serve.webhooks``; pure (no I/O).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator

from treadle import errors, hooktokens
from treadle.world import ids

WEBHOOK_KEY: Final = "treadle.webhook"
PATH_PREFIX: Final = "/hooks/"
# ``<run id>.<minted token>``: the one path segment after /hooks/.
_PATH_TOKEN = re.compile(r"(wrun_[0-9A-Za-z]{26})\.(hk_[0-9a-f]{32})")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
DEFAULT_TOLERANCE_SECONDS: Final = 300


def _accepted() -> JsonValue:
    return {"accepted": True}


class WebhookResponse(BaseModel):
    """The answer a webhook's caller gets once the request is recorded (a 2xx only: an
    error status would make a sender retry a call the run already took)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: int = Field(default=202, ge=200, le=299)
    # A JSON body (sent as application/json), or a string (sent as text/plain).
    body: JsonValue = Field(default_factory=_accepted)
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _header_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not re.fullmatch(r"[A-Za-z0-9-]{1,64}", name) or "\n" in text or "\r" in text:
                raise ValueError(f"header {name!r} is not a plain header name and one-line value")
        return value


def _check_env(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise ValueError(
            "secret_env names an environment variable (letters, digits, '_'), never the secret"
        )
    return value


class HmacSignature(BaseModel):
    """GitHub style: header ``X-Signature: sha256=<hex HMAC of the raw body>``.

    The secret is read by ``treadle serve`` from its environment variable
    ``secret_env`` when a call arrives; it is never recorded."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scheme: Literal["hmac"] = "hmac"
    header: str = Field(default="X-Signature", pattern=r"^[A-Za-z0-9-]{1,64}$")
    secret_env: str
    algorithm: Literal["sha1", "sha256", "sha512"] = "sha256"
    prefix: str = Field(default="sha256=", max_length=32)

    @field_validator("secret_env")
    @classmethod
    def _env(cls, value: str) -> str:
        return _check_env(value)


class StripeSignature(BaseModel):
    """Stripe style: header ``Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>]``,
    each ``v1`` an HMAC-SHA256 of ``"<t>.<raw body>"``; a ``t`` further than
    ``tolerance_seconds`` from serve's clock is refused (a replayed old call)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scheme: Literal["stripe"] = "stripe"
    header: str = Field(default="Stripe-Signature", pattern=r"^[A-Za-z0-9-]{1,64}$")
    secret_env: str
    tolerance_seconds: int = Field(default=DEFAULT_TOLERANCE_SECONDS, ge=1, le=86400)

    @field_validator("secret_env")
    @classmethod
    def _env(cls, value: str) -> str:
        return _check_env(value)


Signature = Annotated[HmacSignature | StripeSignature, Field(discriminator="scheme")]


class WebhookSpec(BaseModel):
    """What a webhook's hook stores under ``WEBHOOK_KEY`` in its metadata."""

    # What it holds is strict (a scheme or response read wrongly must refuse the call:
    # ``WebhookSpecUnreadable``); a field a newer treadle adds beside them is ignored.
    model_config = ConfigDict(frozen=True)

    # TREADLE_PUBLIC_URL when the webhook was made ("" unset): a replay builds the same
    # URL from it and the recorded token. Never the URL itself: the token is its
    # secret, and readers of the log (the JSON API's read-only role) must not get it.
    base_url: str = ""
    respond: WebhookResponse = Field(default_factory=WebhookResponse)
    signature: Signature | None = None


class WebhookRequest(BaseModel):
    """A call to a webhook's URL, as the awaiting workflow receives it.

    ``headers`` have lower-cased names (repeated ones joined with ``", "``) and are all
    kept, the signature header and ``authorization`` included (a sender's own
    credential may be what the workflow checks; set ``TREADLE_PAYLOAD_KEY`` to keep
    them encrypted at rest). The body is in exactly one of ``body`` (parsed JSON, for a
    JSON content type), ``form`` (``application/x-www-form-urlencoded``), ``text``
    (anything else that is UTF-8) or ``body_base64`` (anything else); all are empty
    for no body.

    Resumed by hand (``resume_hook(token, {"body": ...})``, the JSON API's hook
    resume: a callback the sender lost), only the fields given are set and
    ``received_at`` is None.
    """

    model_config = ConfigDict(frozen=True)

    method: str = "POST"
    path: str = Field(default="", description="what followed the token ('' or '/...')")
    headers: dict[str, str] = Field(default_factory=dict)
    query: dict[str, list[str]] = Field(default_factory=dict)
    content_type: str | None = None
    body: JsonValue = None
    form: dict[str, list[str]] | None = None
    text: str | None = None
    body_base64: str | None = None
    received_at: datetime | None = None

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def field(self, name: str) -> str | None:
        """A form field's (first) value, or None."""
        values = (self.form or {}).get(name)
        return values[0] if values else None


def wrap_metadata(spec: WebhookSpec, metadata: JsonValue) -> JsonValue:
    """The hook metadata of a webhook: its spec, and the app's own metadata."""
    return {WEBHOOK_KEY: spec.model_dump(mode="json"), "metadata": metadata}


def spec_of(metadata: JsonValue) -> WebhookSpec | None:
    """The webhook spec stored in a hook's metadata; None for a hook that is no webhook
    (a plain ``create_hook`` is never answered on ``/hooks/``)."""
    if not isinstance(metadata, dict) or WEBHOOK_KEY not in metadata:
        return None
    try:
        return WebhookSpec.model_validate(metadata[WEBHOOK_KEY])
    except ValidationError as exc:
        raise errors.WebhookSpecUnreadable(
            f"{exc.error_count()} problem(s), first: {exc.errors()[0]['msg']}"
        ) from None


def path_token(run_id: str, stored_token: str) -> str:
    """The path segment after ``/hooks/``: ``<run id>.<bare minted token>``."""
    return f"{run_id}.{hooktokens.bare(stored_token)}"


def url(public_url: str | None, run_id: str, stored_token: str) -> str:
    """``TREADLE_PUBLIC_URL`` + ``/hooks/<run id>.<token>`` (a bare path when unset)."""
    return (public_url or "").rstrip("/") + PATH_PREFIX + path_token(run_id, stored_token)


def parse_path_token(segment: str) -> tuple[str, str] | None:
    """``(run id, bare token)`` of a path segment, or None when it is not one."""
    match = _PATH_TOKEN.fullmatch(segment)
    if match is None or not ids.is_run_id(match.group(1)):
        return None
    return match.group(1), match.group(2)
