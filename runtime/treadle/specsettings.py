"""The spec 8 settings' rules (issue 12): what ``WORKFLOW_SPEC_VERSION`` and
``WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS`` accept.

- ``spec_version``: 8, 9 or unset. Any other value is refused (a ``SettingsError``
  naming the setting, the value and the allowed values, through
  ``settings.load``). This is treadle's rule for bad input; seed 003's runtime
  instead ignores an unknown value with a one-time warning and mints its
  default ("Routing edge cases"), which would start runs in a format nobody asked
  for.
- ``lease_seconds``: a number of seconds, clamped to 1..900 as seed 000 says,
  with a one-time warning naming the value and the clamp; something that is not
  a number (``abc``, NaN) is refused.

Called by ``treadle.settings`` (its field validators); ``treadle settings``
shows the allowed values from the fields' ``allowed`` extra.
"""

from __future__ import annotations

import logging
import math

from treadle.world import specversions

log = logging.getLogger("treadle.settings")

ALLOWED_SPEC_VERSIONS = "8 or 9 (or unset)"

_warned: set[tuple[str, str]] = set()


def _warn_once(setting: str, value: str, text: str) -> None:
    if (setting, value) not in _warned:
        _warned.add((setting, value))
        log.warning(text)


def spec_version(value: object) -> int | None:
    """``WORKFLOW_SPEC_VERSION``: None, 8 or 9; anything else raises ``ValueError``."""
    if value is None:
        return None
    parsed: int | None = None
    if isinstance(value, bool):
        parsed = None
    elif isinstance(value, int):
        parsed = value
    elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        parsed = int(value.strip())
    if parsed is None or parsed not in specversions.SUPPORTED:
        raise ValueError(
            f"allowed values are {ALLOWED_SPEC_VERSIONS}; treadle refuses any other "
            "value instead of minting a default"
        )
    return parsed


def lease_seconds(value: object) -> float:
    """``WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS``: a number, clamped to 1..900."""
    from treadle.orchestrator.spec8 import ownership

    try:
        seconds = float(value) if isinstance(value, str | int | float) else math.nan
    except ValueError:
        seconds = math.nan
    if isinstance(value, bool) or math.isnan(seconds):
        raise ValueError(
            f"must be a number of seconds ({ownership.MIN_LEASE_SECONDS:g} to "
            f"{ownership.MAX_LEASE_SECONDS:g}; values outside are clamped)"
        )
    clamped = ownership.clamp_lease(seconds)
    if clamped != seconds:
        _warn_once(
            "WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS",
            repr(seconds),
            f"WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS={seconds:g} is outside "
            f"{ownership.MIN_LEASE_SECONDS:g}..{ownership.MAX_LEASE_SECONDS:g}; "
            f"clamped to {clamped:g}",
        )
    return clamped
