"""A schedule's options checked at the call (issue 17 "Bad input"), before anything is
recorded: each refusal is a ``ScheduleInvalid`` naming its field.

``check`` turns what ``app.schedule`` (or ``treadle schedules``, or the operator) was
given into a ``records.ScheduleSpec`` and its parsed ``Cron``; ``firing_times`` lists a
cron's firings in a range (backfill, upcoming).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import cast

from pydantic import JsonValue

from treadle import errors, limits
from treadle.schedules import cron as cron_
from treadle.world import records

# Temporal Schedules' defaults (the anchor): skip an overlapping firing; catch up on
# what was missed within a year (the Python SDK's ``SchedulePolicy.catchup_window``).
DEFAULT_OVERLAP: records.ScheduleOverlap = "skip"
DEFAULT_CATCHUP_WINDOW = timedelta(days=365)
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")
MAX_LISTED = 1000  # upcoming/backfill lists at most this many times in one call


def check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise errors.ScheduleInvalid(
            "name",
            f"name: {name!r} is not a schedule name (1 to 200 letters, digits, '.', '_', "
            "':' or '-', starting with a letter or digit)",
        )
    return name


def check_overlap(overlap: object) -> records.ScheduleOverlap:
    if overlap not in records.SCHEDULE_OVERLAPS:
        known = ", ".join(records.SCHEDULE_OVERLAPS)
        raise errors.ScheduleInvalid("overlap", f"overlap: {overlap!r} is not one of {known}")
    return overlap


def check_catchup(catchup: object) -> records.ScheduleCatchup:
    if catchup not in records.SCHEDULE_CATCHUPS:
        known = ", ".join(records.SCHEDULE_CATCHUPS)
        raise errors.ScheduleInvalid("catchup", f"catchup: {catchup!r} is not one of {known}")
    return catchup


def check_deployment(deployment: object) -> str | None:
    if deployment is None:
        return None
    if not isinstance(deployment, str) or not deployment or len(deployment) > 200:
        raise errors.ScheduleInvalid(
            "deployment", f"deployment: {deployment!r} is not a deployment id (1-200 characters)"
        )
    return deployment


def check_window(window: object) -> float:
    seconds = window.total_seconds() if isinstance(window, timedelta) else window
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        raise errors.ScheduleInvalid(
            "catchup_window",
            f"catchup_window: {window!r} is not a positive duration (seconds or a timedelta)",
        )
    return float(seconds)


def check_time(value: object, field: str) -> datetime:
    """An aware datetime, or an ISO 8601 text with its offset (``Z`` for UTC)."""
    parsed = value
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            parsed = None
    if not isinstance(parsed, datetime) or parsed.tzinfo is None:
        raise errors.ScheduleInvalid(
            field, f"{field}: {value!r} is not a time with its zone (2026-12-01T10:00:00Z)"
        )
    return parsed.astimezone(UTC)


def check(
    *,
    name: object,
    workflow_name: str,
    known_workflows: set[str] | None,
    cron: object,
    timezone: object,
    overlap: object,
    catchup_window: object,
    input: JsonValue,
    paused: bool,
    limits_: limits.Limits | None = None,
    deployment: object = None,
    catchup: object = "all",
    cron_field: str = "cron",
    timezone_field: str = "timezone",
) -> tuple[records.ScheduleSpec, cron_.Cron]:
    """The checked spec, or ``ScheduleInvalid`` for its first bad field."""
    check_name(name)
    assert isinstance(name, str)
    if known_workflows is not None and workflow_name not in known_workflows:
        known = ", ".join(sorted(known_workflows)) or "none"
        raise errors.ScheduleInvalid(
            "workflow", f"workflow: no workflow named {workflow_name!r} (registered: {known})"
        )
    if timezone is not None and not isinstance(timezone, str):
        raise errors.ScheduleInvalid("timezone", f"timezone: {timezone!r} is not a zone name")
    parsed = cron_.parse(
        cast(str, cron), timezone or None, field=cron_field, zone_field=timezone_field
    )
    spec = records.ScheduleSpec(
        name=name,
        workflow_name=workflow_name,
        cron=parsed.expression,
        timezone=timezone or "UTC",
        overlap=check_overlap(overlap),
        catchup_window_seconds=check_window(catchup_window),
        input=input,
        paused=bool(paused),
        deployment_id=check_deployment(deployment),
        catchup=check_catchup(catchup),
    )
    limits.check_value(input, f"schedule {name} input", limits_, envelope=2)
    return spec, parsed


def parsed(spec: records.ScheduleSpec) -> cron_.Cron:
    """The stored spec's cron (checked when it was put)."""
    return cron_.parse(spec.cron, spec.timezone)


def firing_times(
    c: cron_.Cron, after: datetime, until: datetime | None, count: int
) -> Iterator[datetime]:
    """At most ``count`` firings strictly after ``after`` and not after ``until``."""
    t = after
    for _ in range(count):
        found = c.next_after(t)
        if found is None or (until is not None and found > until):
            return
        yield found
        t = found
