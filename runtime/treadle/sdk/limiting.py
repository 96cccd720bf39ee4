"""Concurrency and rate limits of a workflow or a step (``docs/limits.md``).

``Limit(key=..., max=N)``: at most ``N`` runs (or step attempts) of one key hold a
slot at a time, across every worker of the World; the others wait, shown as
waiting on the limit, and are admitted by priority (higher first), then in
arrival order. ``Rate(key=..., per_second=...)``: starts of one key are spaced
by the World's shared token bucket (``burst`` at once, then one per interval).

``key`` is called with the workflow's (or step's) own arguments and returns a
string (``None``: one key for all, ``"*"``). A key function that raises or
returns something else is a ``LimitKeyError`` at ``app.start`` or at the step
call, before anything is recorded. A bad ``max`` or rate is refused at
decoration (``ValueError``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from treadle import errors

# A key is stored beside the limit's scope; long enough for any id, short for an index.
MAX_KEY_CHARS = 256
ALL = "*"
MAX_PRIORITY = 1_000_000


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``max`` holders of one key at a time (``key=None``: one key for all)."""

    max: int
    key: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max, bool) or not isinstance(self.max, int) or self.max < 1:
            raise ValueError(f"Limit(max=...) must be an integer of at least 1, got {self.max!r}")
        if self.key is not None and not callable(self.key):
            raise ValueError(f"Limit(key=...) must be a function of the input, got {self.key!r}")


@dataclass(frozen=True, slots=True)
class Rate:
    """At most one start per ``1/per_second`` seconds of one key, after ``burst`` at once.

    Give exactly one of ``per_second``, ``per_minute``, ``per_hour``."""

    key: Callable[..., Any] | None = None
    per_second: float | None = None
    per_minute: float | None = None
    per_hour: float | None = None
    burst: int = 1

    def __post_init__(self) -> None:
        given = [
            (name, value)
            for name, value in (
                ("per_second", self.per_second),
                ("per_minute", self.per_minute),
                ("per_hour", self.per_hour),
            )
            if value is not None
        ]
        if len(given) != 1:
            raise ValueError("Rate(...) needs exactly one of per_second, per_minute, per_hour")
        name, value = given[0]
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(f"Rate({name}=...) must be a number above 0, got {value!r}")
        if not math.isfinite(float(value)):
            raise ValueError(f"Rate({name}=...) must be finite, got {value!r}")
        if self.interval_ms < 1:
            raise ValueError(f"Rate({name}={value!r}) is over 1,000 starts a second")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise ValueError(
                f"Rate(burst=...) must be an integer of at least 1, got {self.burst!r}"
            )
        if self.key is not None and not callable(self.key):
            raise ValueError(f"Rate(key=...) must be a function of the input, got {self.key!r}")

    @property
    def interval_ms(self) -> int:
        """Milliseconds between two starts of one key."""
        if self.per_second is not None:
            return round(1000 / self.per_second)
        if self.per_minute is not None:
            return round(60_000 / self.per_minute)
        assert self.per_hour is not None
        return round(3_600_000 / self.per_hour)


@dataclass(frozen=True, slots=True)
class Limits:
    """What a workflow or step declared: its concurrency limit and rate, either or both."""

    concurrency: Limit | None = None
    rate: Rate | None = None

    @property
    def any(self) -> bool:
        return self.concurrency is not None or self.rate is not None


def declared(where: str, concurrency: Any, rate: Any) -> Limits:
    """Check a decorator's ``concurrency=`` and ``rate=`` (``ValueError`` naming ``where``)."""
    if concurrency is not None and not isinstance(concurrency, Limit):
        raise ValueError(f"{where}: concurrency= takes a treadle.Limit, got {concurrency!r}")
    if rate is not None and not isinstance(rate, Rate):
        raise ValueError(f"{where}: rate= takes a treadle.Rate, got {rate!r}")
    return Limits(concurrency=concurrency, rate=rate)


def check_priority(where: str, priority: Any) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"{where}: priority must be an integer, got {priority!r}")
    if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(f"{where}: priority must be within ±{MAX_PRIORITY:,}, got {priority}")
    return priority


def compute_key(
    fn: Callable[..., Any] | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    where: str,
    limit: str,
) -> str:
    """The key for these arguments; ``LimitKeyError`` naming ``where`` and ``limit``."""
    if fn is None:
        return ALL
    try:
        key = fn(*args, **kwargs)
    except Exception as exc:
        raise errors.LimitKeyError(where, limit, f"{type(exc).__name__}: {exc}") from None
    if not isinstance(key, str):
        raise errors.LimitKeyError(
            where, limit, f"the key function returned {type(key).__name__}, not a string"
        )
    if not key or len(key) > MAX_KEY_CHARS or "\x00" in key:
        raise errors.LimitKeyError(
            where, limit, f"a key is 1 to {MAX_KEY_CHARS} characters without NUL, got {key!r}"
        )
    try:
        key.encode()
    except UnicodeEncodeError:
        raise errors.LimitKeyError(where, limit, "the key is not valid UTF-8") from None
    return key
