"""A WorkflowSchedule's timing: the runtime's cron parser (``treadle.schedules.cron``)
under the CRD's field names.

One parser serves the World's schedules and the operator: the syntax, the time-zone
rules and ``Cron`` (``next_after``, ``latest``) are documented there. ``parse`` here
names ``spec.schedule`` and ``spec.timeZone`` in its errors and raises the operator's
``InvalidSchedule`` (with ``field``), as ``schedules`` and ``scheduler`` expect.
"""

from __future__ import annotations

from zoneinfo import ZoneInfo

from treadle.errors import ScheduleInvalid
from treadle.schedules import cron as _cron
from treadle.schedules.cron import MACROS, SEARCH_YEARS, Cron
from treadle_operator.errors import InvalidSchedule

__all__ = ["FIELD", "MACROS", "SEARCH_YEARS", "ZONE_FIELD", "Cron", "parse", "zone"]

FIELD = "spec.schedule"
ZONE_FIELD = "spec.timeZone"


def zone(name: str | None) -> ZoneInfo:
    """The IANA time zone ``spec.timeZone`` names (UTC when empty)."""
    try:
        return _cron.zone(name, ZONE_FIELD)
    except ScheduleInvalid as exc:
        raise InvalidSchedule(exc.field, str(exc)) from None


def parse(expression: str, time_zone: str | None = None) -> Cron:
    """A ``Cron`` from ``spec.schedule`` and ``spec.timeZone``; ``InvalidSchedule`` if not."""
    try:
        return _cron.parse(expression, time_zone, field=FIELD, zone_field=ZONE_FIELD)
    except ScheduleInvalid as exc:
        raise InvalidSchedule(exc.field, str(exc)) from None
