"""The one clock and the one source of randomness the engine reads.

Every read of the time (wall or monotonic) and every random draw that the
orchestrator, the step handler, the client, ids and the in-memory World make
goes through this module, so that the deterministic simulation
(``treadle.testing.simulation``) can put them all on its virtual clock and its
seeded PRNG with one ``use(...)``. Real Worlds whose servers keep their own
time (SQLite rows, JetStream schedules) may read the system clock directly.

Outside a simulation this is the system clock and ``os.urandom``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    """Where the time and random bytes come from."""

    def time(self) -> float:
        """Seconds since the epoch (wall time)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""
        ...

    def random_bytes(self, n: int) -> bytes: ...


class SystemClock:
    """The machine's clocks and ``os.urandom``."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def random_bytes(self, n: int) -> bytes:
        return os.urandom(n)


SYSTEM = SystemClock()
_current: Clock = SYSTEM


def current() -> Clock:
    return _current


@contextlib.contextmanager
def use(clock: Clock) -> Iterator[Clock]:
    """Read ``clock`` everywhere inside the block (the simulation's virtual clock)."""
    global _current
    previous, _current = _current, clock
    try:
        yield clock
    finally:
        _current = previous


def now() -> float:
    """Wall time, epoch seconds."""
    return _current.time()


def now_ms() -> int:
    """Wall time, epoch milliseconds."""
    return int(_current.time() * 1000)


def utcnow() -> datetime:
    """Wall time as an aware UTC datetime."""
    return datetime.fromtimestamp(_current.time(), UTC)


def monotonic() -> float:
    return _current.monotonic()


def random_bytes(n: int) -> bytes:
    return _current.random_bytes(n)


def token_hex(n: int) -> str:
    """``2n`` hex digits of randomness (lease tokens)."""
    return _current.random_bytes(n).hex()
