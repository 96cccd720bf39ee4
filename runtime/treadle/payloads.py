"""Payload encryption at rest: an optional AES-GCM codec over the values ``serde`` encodes.

With ``TREADLE_PAYLOAD_KEY`` (or ``TREADLE_PAYLOAD_KEY_FILE``, a mounted file) set,
every value ``serde.encode`` makes (run inputs, workflow outputs, step arguments and
results, hook payloads) reaches the World as an envelope, never as plaintext::

    {"$t": "enc", "kid": "<key id>", "v": "<base64: 12-byte nonce, ciphertext, tag>"}

The plaintext is the compact JSON text of the encoded value; the key id and a version
are authenticated with it (AES-GCM associated data), so a tampered envelope, or one
relabelled with another key id, fails to open. ``serde.decode`` opens envelopes with
the key their id names.

**Keys.** The setting holds one or more keys, comma or newline separated, each
``<kid>:<base64 of 32 random bytes>``; ``treadle payload-key`` (the CLI) prints a new
one. The first key encrypts; every key listed decrypts. Rotation: put the new key
first and keep the old ones for as long as a run started under them may replay (a
run's log is read again on every delivery, so until such runs ended and their
values are no longer read). Removing a key makes its values unreadable: ``decode``
raises ``PayloadKeyMissing`` naming the key id; the CLI and the operator show
``<encrypted>`` in place of a value they cannot open.

**What is not encrypted**: workflow and step names, hook tokens, error messages,
attributes, timing and the log's shape. Values are not bound to the run or slot that
stores them: someone who can write the World can copy one run's envelope into another
run of the same keys (integrity per value, not per log). See SECURITY.md.

The ring in force is a task's (``use``, set by the worker for each delivery and by a
``Workflows`` app whose settings carry a key), else the process settings' (read once).
Nonces come from ``treadle.clock.random_bytes`` so a simulated run replays exactly.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue

from treadle import clock, errors, fastjson

if TYPE_CHECKING:
    from treadle.settings import Settings

TAG = "enc"
VERSION = b"treadle-payload/1"
NONCE_BYTES = 12
KEY_BYTES = 32
ENCRYPTED_PLACEHOLDER = "<encrypted>"
_KID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class KeyRing:
    """Keys by id; ``primary`` encrypts, every key decrypts."""

    primary: str
    keys: dict[str, bytes]

    @classmethod
    def parse(cls, text: str, *, setting: str = "TREADLE_PAYLOAD_KEY") -> KeyRing:
        """Parse ``kid:base64key`` entries (comma or newline separated). A bad entry is a
        ``SettingsError`` naming the entry's position, never its key material."""
        entries = [e.strip() for e in re.split(r"[,\n]", text) if e.strip()]
        if not entries:
            raise errors.SettingsError(f"{setting} is empty; expected <key id>:<base64 key>")
        keys: dict[str, bytes] = {}
        for n, entry in enumerate(entries, 1):
            kid, sep, material = entry.partition(":")
            if not sep or not _KID.fullmatch(kid):
                raise errors.SettingsError(
                    f"{setting} entry {n}: expected <key id>:<base64 key>, the key id of "
                    "1-64 letters, digits, '.', '_' or '-'"
                )
            try:
                key = base64.b64decode(material, validate=True)
            except (binascii.Error, ValueError):
                raise errors.SettingsError(
                    f"{setting} entry {n} (key id {kid!r}): the key is not valid base64"
                ) from None
            if len(key) != KEY_BYTES:
                raise errors.SettingsError(
                    f"{setting} entry {n} (key id {kid!r}): the key has {len(key)} bytes; "
                    f"AES-256-GCM needs {KEY_BYTES} (make one with `treadle payload-key`)"
                )
            if kid in keys:
                raise errors.SettingsError(f"{setting} entry {n}: key id {kid!r} appears twice")
            keys[kid] = key
        return cls(primary=entries[0].partition(":")[0], keys=keys)

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyRing | None:
        text = settings.payload_keys()
        if text is None:
            return None
        try:
            import cryptography  # noqa: F401
        except ImportError:
            raise errors.SettingsError(
                "TREADLE_PAYLOAD_KEY is set, but payload encryption needs the cryptography "
                "package: pip install 'treadle[encryption]'"
            ) from None
        return cls.parse(text)

    def __repr__(self) -> str:  # never the key material
        return f"KeyRing(primary={self.primary!r}, kids={sorted(self.keys)!r})"


def new_key(kid: str) -> str:
    """A fresh ``kid:base64key`` entry (32 random bytes from the OS)."""
    import secrets

    if not _KID.fullmatch(kid):
        raise errors.SettingsError(f"key id {kid!r}: use 1-64 letters, digits, '.', '_' or '-'")
    return f"{kid}:{base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode('ascii')}"


# -- the ring in force ---------------------------------------------------------------

_CURRENT: contextvars.ContextVar[KeyRing | None] = contextvars.ContextVar(
    "treadle_payload_keys", default=None
)
_NONE = KeyRing(primary="", keys={})  # "no key" installed on purpose (``use(None)``)
_process: KeyRing | None = None
_process_read = False


def active() -> KeyRing | None:
    """The ring in force: a task's (``use``), else the process settings' (read once)."""
    global _process, _process_read
    current = _CURRENT.get()
    if current is not None:
        return None if current is _NONE else current
    if not _process_read:
        from treadle import settings

        _process_read = True
        try:
            _process = KeyRing.from_settings(settings.load())
        except errors.SettingsError:
            _process = None  # a bad setting is reported where settings are validated
    return _process


def use(ring: KeyRing | None) -> None:
    """Install ``ring`` (None: no encryption) for the current task and the tasks it starts."""
    _CURRENT.set(_NONE if ring is None else ring)


# -- sealing and opening -------------------------------------------------------------


def _aad(kid: str) -> bytes:
    return VERSION + b"\x00" + kid.encode("ascii")


def seal(data: JsonValue, ring: KeyRing) -> dict[str, JsonValue]:
    """``data`` (already serde-encoded) as an envelope under the ring's primary key."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    plain = fastjson.dumps(data)
    nonce = clock.random_bytes(NONCE_BYTES)
    sealed = AESGCM(ring.keys[ring.primary]).encrypt(nonce, plain, _aad(ring.primary))
    return {
        "$t": TAG,
        "kid": ring.primary,
        "v": base64.b64encode(nonce + sealed).decode("ascii"),
    }


def is_envelope(data: Any) -> bool:
    return isinstance(data, dict) and data.get("$t") == TAG and "kid" in data


def open_(data: dict[str, Any], ring: KeyRing | None, path: str = "value") -> JsonValue:
    """The serde-encoded value inside an envelope; ``PayloadKeyMissing`` without its key,
    ``PayloadDecryptionFailed`` when it does not authenticate."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    kid = data.get("kid")
    if not isinstance(kid, str) or not _KID.fullmatch(kid):
        raise errors.PayloadDecryptionFailed(path, "the envelope's key id is malformed")
    if ring is None or kid not in ring.keys:
        raise errors.PayloadKeyMissing(path, kid)
    try:
        raw = base64.b64decode(str(data.get("v", "")), validate=True)
    except (binascii.Error, ValueError):
        raise errors.PayloadDecryptionFailed(path, "the envelope is not valid base64") from None
    if len(raw) < NONCE_BYTES + 16:
        raise errors.PayloadDecryptionFailed(path, "the envelope is too short")
    try:
        plain = AESGCM(ring.keys[kid]).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _aad(kid))
    except InvalidTag:
        raise errors.PayloadDecryptionFailed(
            path, f"the value does not authenticate under key {kid!r} (tampered, or another key)"
        ) from None
    value: JsonValue = json.loads(plain.decode("utf-8"))
    return value


def display(data: Any, ring: KeyRing | None = None) -> Any:
    """Stored data for a person to read: envelopes opened where a key is held, else
    ``"<encrypted>"``; never raises for an envelope."""
    ring = ring if ring is not None else active()
    if is_envelope(data):
        try:
            return display(open_(data, ring), ring)
        except errors.TreadleError:
            return ENCRYPTED_PLACEHOLDER
    if isinstance(data, list):
        return [display(item, ring) for item in data]
    if isinstance(data, dict):
        return {k: display(v, ring) for k, v in data.items()}
    return data
