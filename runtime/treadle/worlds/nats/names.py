"""Where the NATS queue keeps things: subjects, consumer and bucket names, headers, ids.

One stream holds every deployment's messages on per-run subjects::

    <prefix>.<deployment>.orch.<run_id>     orchestrator messages
    <prefix>.<deployment>.step.<run_id>     step messages
    <prefix>.<deployment>.sched.<msg_id>    a delayed send's schedule, until it fires
    <prefix>.<deployment>.dead.<msg_id>     a dead letter (no consumer reads it)

Each deployment has two durable pull consumers (``<deployment>_orch`` and
``<deployment>_step``) and its run leases live in one KV bucket per stream under
``<deployment>.<run_id>``; each consuming worker's heartbeat lives in
``<stream>_WORKERS`` under ``<deployment>.<worker_id>``. A name that is not a
safe token is made one by ``token``. Called by every module of the package.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote, unquote

from treadle.world import ids, messages

DEFAULT_STREAM: Final = "TREADLE"
DEFAULT_SUBJECT_PREFIX: Final = "treadle"

# Headers every treadle message carries (the payload is the message's JSON).
MESSAGE_ID: Final = "Treadle-Message-Id"
KEY: Final = "Treadle-Key"
# Deliveries before this stream message (a handoff's republish carries them on).
DELIVERY_OFFSET: Final = "Treadle-Delivery-Offset"
HANDOFFS: Final = "Treadle-Handoffs"
# A dead letter's headers: why and where it died (``deadletters``).
DEAD_KIND: Final = "Treadle-Dead-Kind"
DEAD_RUN_ID: Final = "Treadle-Dead-Run-Id"
DEAD_SUBJECT: Final = "Treadle-Dead-Subject"
DEAD_DELIVERIES: Final = "Treadle-Dead-Deliveries"
DEAD_ERROR: Final = "Treadle-Dead-Error"
DEAD_AT: Final = "Treadle-Dead-At"
# JetStream's own headers.
NATS_MSG_ID: Final = "Nats-Msg-Id"
NATS_SCHEDULE: Final = "Nats-Schedule"
NATS_SCHEDULE_TARGET: Final = "Nats-Schedule-Target"

_SAFE_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_KIND_TOKENS: Final[dict[messages.MessageKind, str]] = {"orchestrator": "orch", "step": "step"}


def token(value: str) -> str:
    """``value`` as one subject token that is also a valid consumer, bucket and key part.

    A safe value (letters, digits, ``_``, ``-``; at most 64) is kept; any other is
    spelled safely and suffixed with a digest of the original, so two values never
    share a token.
    """
    if _SAFE_TOKEN.fullmatch(value):
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:12]
    return f"{_UNSAFE_CHARS.sub('-', value)[:40]}-{digest}"


def validate_name(value: str, what: str) -> str:
    """A stream name or subject prefix must already be a safe token."""
    if not _SAFE_TOKEN.fullmatch(value):
        raise ValueError(f"{what} {value!r} must be 1 to 64 letters, digits, '_' or '-'")
    return value


def keyed_message_id(key: str) -> str:
    """The message id of a keyed send: derived from the key, so a deduplicated send
    returns the first send's id without asking the server."""
    digest = hashlib.sha256(b"treadle-key\x00" + key.encode()).digest()
    return ids.MESSAGE_PREFIX + base64.b32encode(digest).decode()[:26]


def dedupe_id(key: str) -> str:
    """The ``Nats-Msg-Id`` of a keyed send (a digest: any key fits in a header)."""
    return "k-" + hashlib.sha256(key.encode()).hexdigest()


def encode_key(key: str) -> str:
    return quote(key, safe="")


def decode_key(value: str) -> str:
    return unquote(value)


@dataclass(frozen=True, slots=True)
class Names:
    """The names one queue uses: its stream, subject prefix and deployment."""

    stream: str
    prefix: str
    deployment: str

    def subject(self, kind: messages.MessageKind, deployment: str | None, run_id: str) -> str:
        dep = token(deployment or self.deployment)
        return f"{self.prefix}.{dep}.{_KIND_TOKENS[kind]}.{token(run_id)}"

    def schedule_subject(self, deployment: str | None, message_id: str) -> str:
        return f"{self.prefix}.{token(deployment or self.deployment)}.sched.{token(message_id)}"

    def dead_subject(self, message_id: str) -> str:
        return f"{self.prefix}.{token(self.deployment)}.dead.{token(message_id)}"

    @property
    def dead_filter(self) -> str:
        """Every deployment's dead letters."""
        return f"{self.prefix}.*.dead.>"

    @property
    def stream_subjects(self) -> list[str]:
        return [f"{self.prefix}.>"]

    def filter_subject(self, kind: messages.MessageKind) -> str:
        return f"{self.prefix}.{token(self.deployment)}.{_KIND_TOKENS[kind]}.>"

    def consumer(self, kind: messages.MessageKind, deployment: str | None = None) -> str:
        return f"{token(deployment or self.deployment)}_{_KIND_TOKENS[kind]}"

    @property
    def lease_bucket(self) -> str:
        return f"{self.stream}_RUNS"

    def lease_key(self, run_id: str, deployment: str | None = None) -> str:
        """The KV key of a run's lease on ``deployment`` (default: this queue's)."""
        return f"{token(deployment or self.deployment)}.{token(run_id)}"

    @property
    def worker_bucket(self) -> str:
        """The KV bucket of worker heartbeats (``liveness``)."""
        return f"{self.stream}_WORKERS"

    def worker_key(self, worker_id: str) -> str:
        """The KV key of a worker's heartbeat entry on this queue's deployment."""
        return f"{token(self.deployment)}.{token(worker_id)}"
