"""Hook tokens: minted, namespaced and signed (issue 16 item 8; security.md L1).

- **Minted.** ``create_hook()`` without a token gets ``hk_`` and 128 random bits
  (``clock.token_hex``, so the simulation replays it). The token is in the run's
  log (``hook_created``): a replay, even on another worker after a restart, takes
  it from there rather than drawing a new one.
- **Namespaced.** A user-chosen token is as guessable as what it is made of
  (``approve:{order_id}``), and tokens are unique across the whole World. With the
  setting ``TREADLE_HOOK_TOKEN_NAMESPACE=NS`` (workers and clients of a deployment
  alike) every token is stored as ``NS/token``: two deployments sharing a World
  cannot squat each other's tokens. Callers keep using the bare token; the World
  and the log hold ``NS/token``. A replay accepts the token it recorded under any
  namespace, so changing the setting never breaks a run in flight.
- **Signed.** ``create_hook(..., require_signature=True)`` makes a resume carry
  ``hook_signature(token, key)``, an HMAC-SHA256 of the bare token with a key the
  app holds (``TREADLE_HOOK_KEY`` or ``TREADLE_HOOK_KEY_FILE``). Give the signature
  to whoever may resume (a link in an email); a resume without it, or with a wrong
  one, is ``HookSignatureInvalid`` and writes nothing. The requirement is kept in
  the hook's stored metadata (``wrap_metadata``), so it binds whichever process
  resumes.

Called by ``treadle.sdk.hooks`` (workflow side), ``treadle.replay.engine`` (replay)
and ``treadle.client`` (``resume_hook``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Final

from pydantic import JsonValue

from treadle import clock, errors

MINTED_PREFIX: Final = "hk_"
MINTED_BYTES: Final = 16  # 128 bits
NAMESPACE_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SIGNATURE_KEY: Final = "treadle.signature"
_MINTED = re.compile(r"hk_[0-9a-f]{32}")


def mint() -> str:
    """A fresh unguessable token: ``hk_`` and 32 hex digits."""
    return MINTED_PREFIX + clock.token_hex(MINTED_BYTES)


def is_minted(token: str) -> bool:
    return _MINTED.fullmatch(bare(token)) is not None


def stored(token: str, namespace: str | None) -> str:
    """The token as the World keys it: ``namespace/token``, or the token alone."""
    return f"{namespace}/{token}" if namespace else token


def bare(stored_token: str) -> str:
    """A minted token without its namespace (minted tokens hold no ``/``)."""
    _, sep, tail = stored_token.rpartition("/")
    return tail if sep and _MINTED.fullmatch(tail) else stored_token


def resolve(token: str | None, namespace: str | None, recorded: str | None) -> str:
    """The stored token of a hook created at a position the log may already hold
    (``recorded``: the token there). A minted token is taken from the log on replay;
    a user token recorded under another namespace (or none) is the same hook."""
    if token is None:
        if recorded is not None and is_minted(recorded):
            return recorded
        return stored(mint(), namespace)
    full = stored(token, namespace)
    if recorded is not None and recorded != full:
        head, sep, tail = recorded.partition("/")
        if recorded == token or (sep and tail == token and NAMESPACE_PATTERN.fullmatch(head)):
            return recorded
    return full


def check_namespace(namespace: str | None) -> str | None:
    if namespace is not None and not NAMESPACE_PATTERN.fullmatch(namespace):
        raise ValueError(
            "must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return namespace


def signature(token: str, key: str | bytes) -> str:
    """``hook_signature``: the HMAC-SHA256 of ``token`` with ``key``, as hex."""
    raw = key.encode() if isinstance(key, str) else key
    if not raw:
        raise ValueError("a hook signature key must not be empty")
    return hmac.new(raw, token.encode(), hashlib.sha256).hexdigest()


def wrap_metadata(metadata: JsonValue, require_signature: bool) -> JsonValue:
    """What the hook stores as metadata: the app's, wrapped when a signature is required."""
    if not require_signature:
        return metadata
    return {SIGNATURE_KEY: "required", "metadata": metadata}


def requires_signature(metadata: JsonValue) -> bool:
    return isinstance(metadata, dict) and metadata.get(SIGNATURE_KEY) == "required"


def check_signature(token: str, metadata: JsonValue, given: str | None, key: str | None) -> None:
    """Refuse a resume whose hook requires a signature (or that carries one) unless it
    is ``signature(token, key)``; compared in constant time."""
    if given is None and not requires_signature(metadata):
        return
    if given is None:
        raise errors.HookSignatureInvalid(token, "the hook requires a signature and none was given")
    if not key:
        raise errors.HookSignatureInvalid(
            token, "a signature was given but TREADLE_HOOK_KEY is not set, so it cannot be checked"
        )
    if not hmac.compare_digest(given.strip().lower(), signature(token, key)):
        raise errors.HookSignatureInvalid(token, "the signature does not match")
