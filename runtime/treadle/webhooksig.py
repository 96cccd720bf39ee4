"""Webhook signatures: verify a call's HMAC over its raw body (issue 13 item 1).

Two schemes, as the webhook chose at creation (``treadle.webhookspec``):

- ``HmacSignature`` (GitHub): the header is ``<prefix><hex HMAC(secret, raw body)>``,
  e.g. ``X-Hub-Signature-256: sha256=6f1c...``.
- ``StripeSignature`` (Stripe): the header is ``t=<unix seconds>,v1=<hex>[,v1=<hex>...]``,
  each ``v1`` a hex HMAC-SHA256 of ``"<t>." + raw body``; one must match (several let a
  sender roll its secret), and ``t`` must be within ``tolerance_seconds`` of ``now``.

Every comparison is constant-time (``hmac.compare_digest``). The secret is read from
the environment by the caller (``treadle.serve.webhooks``) and never recorded. A
refusal is ``WebhookSignatureInvalid`` whose ``reason`` names the problem without
echoing any expected value. ``sign_hmac``/``sign_stripe`` make headers (tests, docs,
senders written in Python).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from treadle import errors
from treadle.webhookspec import HmacSignature, StripeSignature


def _mac(secret: str, algorithm: str, data: bytes) -> str:
    return hmac.new(secret.encode(), data, getattr(hashlib, algorithm)).hexdigest()


def sign_hmac(
    secret: str, body: bytes, *, algorithm: str = "sha256", prefix: str = "sha256="
) -> str:
    """The ``HmacSignature`` header value for ``body``."""
    return prefix + _mac(secret, algorithm, body)


def sign_stripe(secret: str, body: bytes, timestamp: int) -> str:
    """The ``StripeSignature`` header value for ``body`` sent at ``timestamp``."""
    return f"t={timestamp},v1={_mac(secret, 'sha256', str(timestamp).encode() + b'.' + body)}"


def verify(
    scheme: HmacSignature | StripeSignature,
    headers: Mapping[str, str],
    body: bytes,
    secret: str,
    *,
    now: float,
    token: str,
    run_id: str,
) -> None:
    """Raise ``WebhookSignatureInvalid`` unless ``headers`` sign ``body`` with ``secret``.

    ``headers`` has lower-cased names; ``now`` is serve's clock in unix seconds.
    """

    def refuse(reason: str) -> errors.WebhookSignatureInvalid:
        return errors.WebhookSignatureInvalid(token, reason, run_id=run_id, header=scheme.header)

    given = headers.get(scheme.header.lower())
    if given is None or not given.strip():
        raise refuse(f"the signature header {scheme.header} is missing")
    given = given.strip()
    if isinstance(scheme, HmacSignature):
        if not given.lower().startswith(scheme.prefix.lower()):
            raise refuse(
                f"the signature header {scheme.header} does not start with {scheme.prefix!r}"
            )
        digest = given[len(scheme.prefix) :].strip().lower()
        if not hmac.compare_digest(digest, _mac(secret, scheme.algorithm, body)):
            raise refuse(f"the signature in {scheme.header} does not match the body")
        return
    timestamp, candidates = _parse_stripe(given)
    if timestamp is None or not candidates:
        raise refuse(f"the signature header {scheme.header} is not t=<unix seconds>,v1=<hex>")
    expected = _mac(secret, "sha256", str(timestamp).encode() + b"." + body)
    matched = False
    for candidate in candidates:  # every candidate compared: no early exit on a match
        matched |= hmac.compare_digest(candidate.lower(), expected)
    if not matched:
        raise refuse(f"no v1 signature in {scheme.header} matches the body")
    skew = abs(now - timestamp)
    if skew > scheme.tolerance_seconds:
        raise refuse(
            f"the signature's timestamp is {int(skew)} s from now, outside the "
            f"tolerance of {scheme.tolerance_seconds} s (a replayed or delayed call)"
        )


def _parse_stripe(value: str) -> tuple[int | None, list[str]]:
    timestamp: int | None = None
    candidates: list[str] = []
    for part in value.split(","):
        key, sep, item = part.strip().partition("=")
        if not sep:
            continue
        if key == "t" and item.isdigit() and len(item) <= 12:
            timestamp = int(item)
        elif key == "v1" and item:
            candidates.append(item)
    return timestamp, candidates
