"""Durations as users write them: ``"1h"``, ``"1d 2h"``, ``"500ms"``, seconds, timedelta."""

from __future__ import annotations

import math
import re
from datetime import timedelta

_UNITS = {
    "ms": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
    "w": 604800.0,
}
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*")

Duration = str | int | float | timedelta


def to_seconds(value: Duration, *, what: str = "duration") -> float:
    """Seconds in ``value``; a clear ValueError names what is wrong with it."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ValueError(f"{what} must be a duration, not a bool")
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        pos, seconds = 0, 0.0
        while pos < len(text):
            match = _PART.match(text, pos)
            if match is None or match.group(2) not in _UNITS:
                raise ValueError(
                    f"{what} {value!r} is not a duration; write it like '30s', '5m', '1h', "
                    "'2d' or '1h 30m'"
                )
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if not text:
            raise ValueError(f"{what} is empty")
    else:
        raise ValueError(f"{what} must be a str, number or timedelta, not {type(value).__name__}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{what} must be a finite, non-negative duration, got {value!r}")
    return seconds


def positive_seconds(value: Duration, *, what: str) -> float:
    """``to_seconds`` for a timeout: zero, negative or unparsable is a clear ValueError."""
    seconds = to_seconds(value, what=what)
    if seconds <= 0:
        raise ValueError(f"{what} must be a positive duration, got {value!r}")
    return seconds
