"""The spec 8 settings (issue 12 item 1; "Bad input"): ``WORKFLOW_SPEC_VERSION`` takes
8, 9 or nothing, anything else a ``SettingsError`` naming the setting, the value and the
allowed values (treadle's rule, not seed 003's silent fallback); the ownership lease is
clamped to 1..900 with a one-time warning (seed 000), and a non-number is refused."""

from __future__ import annotations

import logging

import pytest

from treadle import settings, specsettings
from treadle.errors import SettingsError


@pytest.mark.parametrize(("raw", "parsed"), [(None, None), ("8", 8), ("9", 9), (" 9 ", 9)])
def test_the_spec_version_takes_8_9_or_nothing(raw: str | None, parsed: int | None) -> None:
    env = {} if raw is None else {"WORKFLOW_SPEC_VERSION": raw}
    assert parsed == settings.load(env).WORKFLOW_SPEC_VERSION


@pytest.mark.parametrize("raw", ["7", "10", "0", "-9", "8.5", "nine", "true"])
def test_any_other_spec_version_is_an_error_naming_setting_value_and_allowed_values(
    raw: str,
) -> None:
    with pytest.raises(SettingsError) as refused:
        settings.load({"WORKFLOW_SPEC_VERSION": raw})
    text = str(refused.value)
    assert f"WORKFLOW_SPEC_VERSION={raw!r}" in text
    assert "allowed values are 8 or 9 (or unset)" in text
    assert "\n" not in text


def test_a_spec_version_override_outside_8_and_9_is_refused_too() -> None:
    with pytest.raises(SettingsError, match="allowed values are 8 or 9"):
        settings.load({}, WORKFLOW_SPEC_VERSION=12)


@pytest.mark.parametrize(
    ("raw", "clamped"), [("0", 1.0), ("-5", 1.0), ("901", 900.0), ("1e9", 900.0), ("inf", 900.0)]
)
def test_a_lease_outside_1_to_900_is_clamped_with_a_warning_naming_value_and_clamp(
    raw: str, clamped: float, caplog: pytest.LogCaptureFixture
) -> None:
    specsettings._warned.clear()
    with caplog.at_level(logging.WARNING, logger="treadle.settings"):
        first = settings.load({"WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS": raw})
        again = settings.load({"WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS": raw})
    assert clamped == first.WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS
    assert clamped == again.WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS
    (warning,) = [r.getMessage() for r in caplog.records]  # once per process
    assert warning.startswith(f"WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS={float(raw):g} ")
    assert f"clamped to {clamped:g}" in warning and "1..900" in warning


@pytest.mark.parametrize("raw", ["1", "860", "900", "30.5"])
def test_a_lease_inside_the_range_is_kept_without_a_warning(
    raw: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="treadle.settings"):
        loaded = settings.load({"WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS": raw})
    assert float(raw) == loaded.WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS
    assert caplog.records == []


def test_the_lease_defaults_to_860() -> None:
    assert settings.load({}).WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS == 860.0


@pytest.mark.parametrize("raw", ["nan", "NaN", "soon", "12s"])
def test_a_lease_that_is_not_a_number_is_an_error(raw: str) -> None:
    with pytest.raises(SettingsError) as refused:
        settings.load({"WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS": raw})
    text = str(refused.value)
    assert f"WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS={raw!r}" in text
    assert "must be a number of seconds (1 to 900" in text
