"""Identifiers: run ids are ``wrun_`` plus a ULID, so a run's creation time can be
read back from its id on every delivery (the workflow clock's origin).

Called by the Worlds (minting run and message ids) and by replay (reading the
time back).
"""

from __future__ import annotations

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
