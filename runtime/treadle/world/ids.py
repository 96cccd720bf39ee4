"""Identifiers: run ids are ``wrun_`` plus a ULID, so a run's creation time can be
read back from its id on every delivery (the workflow clock's origin).

A *keyed* run id (``keyed_run_id``) is the same shape with the ULID's time field
zero and its 80 other bits a digest of a caller's key: the same key always names
the same run (the operator derives it from a WorkflowRun's namespace, name and
run key, so a re-applied object finds its run). Such an id carries no time, so
replay takes the clock's origin from the run's ``run_created`` event instead
(``clock_origin``).

Called by the Worlds (minting run and message ids) and by replay (reading the
time back).
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime

from treadle import clock

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_DECODE = {c: i for i, c in enumerate(_CROCKFORD)}
RUN_PREFIX = "wrun_"
MESSAGE_PREFIX = "msg_"
# Matched whole (``fullmatch``): ``$`` let ``"wrun_...\n"`` pass (security.md L3).
RUN_ID_PATTERN = re.compile(r"wrun_[0-9A-HJKMNP-TV-Z]{26}")


def new_ulid(at_ms: int | None = None) -> str:
    """A ULID: 48 bits of epoch milliseconds, 80 random bits, Crockford base32."""
    ms = clock.now_ms() if at_ms is None else at_ms
    if not 0 <= ms < 1 << 48:
        raise ValueError(f"ULID time {ms} ms is out of range")
    value = (ms << 80) | int.from_bytes(clock.random_bytes(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_run_id(at_ms: int | None = None) -> str:
    return RUN_PREFIX + new_ulid(at_ms)


def keyed_run_id(key: str) -> str:
    """The run id a key names: time field zero, then 80 bits of the key's SHA-256."""
    value = int.from_bytes(hashlib.sha256(key.encode()).digest()[:10], "big")
    chars = []
    for _ in range(16):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return RUN_PREFIX + "0" * 10 + "".join(reversed(chars))


def is_keyed_run_id(run_id: str) -> bool:
    """A run id made by ``keyed_run_id`` (its time field is zero)."""
    return is_run_id(run_id) and run_id[len(RUN_PREFIX) : len(RUN_PREFIX) + 10] == "0" * 10


def clock_origin(run_id: str, recorded: datetime | None) -> datetime:
    """When a run's workflow clock starts: its id's time, or for a keyed id the time its
    ``run_created`` event was recorded (``recorded``)."""
    if is_keyed_run_id(run_id) and recorded is not None:
        return recorded
    return run_created_at(run_id)


def new_message_id() -> str:
    return MESSAGE_PREFIX + new_ulid()


def is_run_id(value: object) -> bool:
    """``wrun_`` and 26 Crockford base32 characters, exactly: no trailing newline."""
    return isinstance(value, str) and RUN_ID_PATTERN.fullmatch(value) is not None


def run_created_at(run_id: str) -> datetime:
    """The creation time encoded in a run id (millisecond precision)."""
    if not is_run_id(run_id):
        raise ValueError(f"{run_id!r} is not a run id (expected wrun_ and 26 base32 characters)")
    value = 0
    for ch in run_id[len(RUN_PREFIX) : len(RUN_PREFIX) + 10]:
        value = value * 32 + _DECODE[ch]
    return datetime.fromtimestamp(value / 1000, tz=UTC)


def event_id(slot: int) -> str:
    """The id of the event at a slot: ``evnt_`` and the zero-padded slot."""
    return f"evnt_{slot:010d}"
