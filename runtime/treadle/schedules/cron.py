"""Cron expressions and their firing instants in a time zone: one parser for the World's
schedules (``treadle.schedules``) and the operator's WorkflowSchedule
(``treadle_operator.cron`` re-exports it under the CRD's field names).

Pure and synchronous: ``parse`` turns an expression and a time zone into a ``Cron``
(or raises ``treadle.errors.ScheduleInvalid`` naming the field: ``cron`` and
``timezone`` by default, the caller's names when given), ``Cron.next_after`` gives
the first firing instant after a given one, and ``Cron.latest`` the most recent one in
a window with how many there were. tests/operator/test_schedules.py and
tests/engine/test_schedules_cron.py pin its rules.

The syntax is Kubernetes CronJob's (robfig/cron v3 ``ParseStandard``), which Argo
CronWorkflow shares: five fields ``minute hour day-of-month month day-of-week``;
``*``, ``?`` (day fields), lists ``a,b``, ranges ``a-b``, steps ``*/n``, ``a-b/n`` and
``a/n`` (``a`` to the field's end); month names ``JAN``-``DEC`` and day names
``SUN``-``SAT``; the macros ``@yearly`` (``@annually``), ``@monthly``, ``@weekly``,
``@daily`` (``@midnight``) and ``@hourly``. When both day fields are restricted a day
matches either (cron's OR); when one starts with ``*`` or ``?`` both must match. Two
extensions: a sixth, leading *seconds* field (``*/5 * * * * *``, robfig's
``WithSeconds`` layout), and day-of-week ``7`` for Sunday. Not supported (refused with
the reason): ``@every``, Quartz's ``L``/``W``/``#``, and ``CRON_TZ=``/``TZ=`` prefixes
(name the zone in its own field, as CronJob requires since Kubernetes 1.27).

Time zones (``zoneinfo``, IANA names; none means UTC) follow CronJob, i.e. robfig/cron:
an instant fires when its local wall time matches the fields. A local time that does
not exist (spring forward) never matches, so that firing is skipped for the day; a
local time that happens twice (fall back) matches twice and fires twice. Fields that
match every hour (``*/15 * * * *``) therefore keep firing every 15 real minutes
across both changes.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from treadle.errors import ScheduleInvalid as InvalidSchedule

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_MONTHS = {m: i for i, m in enumerate(_MONTH_NAMES, 1)}
_DAYS = {d: i for i, d in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (  # name, low, high, names
    ("second", 0, 59, {}),
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 7, _DAYS),
)
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
SEARCH_YEARS = 5  # robfig/cron's limit: no match within five years is "never"
_STEP = timedelta(days=7)  # no zone changes its offset twice within a week
SECOND = timedelta(seconds=1)
FIELD = "cron"
ZONE_FIELD = "timezone"


@dataclass(frozen=True)
class Cron:
    """A parsed schedule: the allowed values of each field, and the zone they are read in."""

    expression: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    day_star: bool
    weekday_star: bool
    zone: ZoneInfo

    # -- matching, in local wall time -------------------------------------------------------

    def day_matches(self, day: date) -> bool:
        dom = day.day in self.days
        dow = (day.weekday() + 1) % 7 in self.weekdays
        if self.day_star or self.weekday_star:
            return dom and dow
        return dom or dow

    def _time_at_or_after(self, hour: int, minute: int, second: int) -> time | None:
        for h in self.hours[bisect.bisect_left(self.hours, hour) :]:
            m0 = minute if h == hour else 0
            for m in self.minutes[bisect.bisect_left(self.minutes, m0) :]:
                s0 = second if (h, m) == (hour, minute) else 0
                i = bisect.bisect_left(self.seconds, s0)
                if i < len(self.seconds):
                    return time(h, m, self.seconds[i])
        return None

    def wall_at_or_after(self, wall: datetime) -> datetime | None:
        """The first naive local time >= ``wall`` (whole seconds) the fields match."""
        day, start = wall.date(), (wall.hour, wall.minute, wall.second)
        limit = day + timedelta(days=366 * SEARCH_YEARS)
        while day <= limit:
            if day.month not in self.months:
                day = (day.replace(day=1) + timedelta(days=32)).replace(day=1)
                start = (0, 0, 0)
                continue
            if self.day_matches(day):
                found = self._time_at_or_after(*start)
                if found is not None:
                    return datetime.combine(day, found)
            day += timedelta(days=1)
            start = (0, 0, 0)
        return None

    # -- instants ---------------------------------------------------------------------------

    def _offset(self, instant: datetime) -> timedelta | None:
        return instant.astimezone(self.zone).utcoffset()

    def next_after(self, after: datetime) -> datetime | None:
        """The first firing instant strictly after ``after`` (aware), in UTC; ``None``: never.

        Walks in real time: within a stretch of one UTC offset local time is a plain
        translation, so it jumps to the next matching wall time; a change of offset on
        the way (found by bisection to the second) restarts the walk at the change.
        """
        t = after.astimezone(UTC).replace(microsecond=0) + SECOND
        for _ in range(60 * SEARCH_YEARS + 400):
            local = t.astimezone(self.zone)
            wall = local.replace(tzinfo=None)
            found = self.wall_at_or_after(wall)
            if found is None:
                return None
            candidate = t + (found - wall)
            stop = min(candidate, t + _STEP)
            if self._offset(stop) == local.utcoffset():
                if stop == candidate:
                    return candidate
                t = stop
                continue
            t = self._change_between(t, stop, local.utcoffset())
        return None

    def _change_between(self, lo: datetime, hi: datetime, offset: timedelta | None) -> datetime:
        """The first second in (lo, hi] whose UTC offset is not ``offset`` (hi's is not)."""
        while hi - lo > SECOND:
            mid = lo + timedelta(seconds=int((hi - lo).total_seconds()) // 2)
            if self._offset(mid) == offset:
                lo = mid
            else:
                hi = mid
        return hi

    def latest(self, since: datetime, now: datetime, cap: int = 100) -> tuple[datetime | None, int]:
        """The most recent firing instant in (since, now], and how many there were.

        The count stops at ``cap + 1`` ("more than cap", as CronJob counts missed
        schedules); the latest is still found, searching back from ``now``.
        """
        count, latest, t = 0, None, since
        while count <= cap:
            found = self.next_after(t)
            if found is None or found > now:
                return latest, count
            count, latest, t = count + 1, found, found
        assert latest is not None
        span = timedelta(seconds=8)
        while True:
            t = max(now - span, latest)
            newest = None
            while (found := self.next_after(t)) is not None and found <= now:
                newest, t = found, found
            if newest is not None or t == latest:
                return newest or latest, count
            span *= 8


def _field(
    text: str, index: int, expression: str, field: str = FIELD
) -> tuple[frozenset[int], bool]:
    """One field's values, and whether it starts with ``*`` or ``?`` (cron's "star")."""
    FIELD = field
    name, low, high, names = _FIELDS[index]
    where = f"{FIELD}: {name} field {text!r} of {expression!r}"
    values: set[int] = set()
    star = False
    for part in text.split(","):
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not _number(step_text) or int(step_text) == 0:
                raise InvalidSchedule(FIELD, f"{where}: step {step_text!r} must be a number >= 1")
            step = int(step_text)
        if base in ("*", "?"):
            if base == "?" and name not in ("day-of-month", "day-of-week"):
                raise InvalidSchedule(FIELD, f"{where}: '?' is only for the day fields")
            star = True
            first, last = low, (6 if name == "day-of-week" else high)
        else:
            first_text, dash, last_text = base.partition("-")
            first = _value(first_text, name, low, high, names, where)
            last = _value(last_text, name, low, high, names, where) if dash else first
            if slash and not dash:
                last = high
            if first > last:
                raise InvalidSchedule(FIELD, f"{where}: range {base!r} runs backwards")
        values.update(range(first, last + 1, step))
    if name == "day-of-week" and 7 in values:
        values = (values - {7}) | {0}
    return frozenset(values), star


def _number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _value(text: str, name: str, low: int, high: int, names: dict[str, int], where: str) -> int:
    field = where.split(":", 1)[0]
    if text.upper() in names:
        return names[text.upper()]
    if not _number(text):
        known = f" or a name ({', '.join(names)})" if names else ""
        raise InvalidSchedule(field, f"{where}: {text!r} is not a number{known}")
    value = int(text)
    if not low <= value <= high:
        raise InvalidSchedule(field, f"{where}: {value} is out of range {low}-{high}")
    return value


def zone(name: str | None, field: str = ZONE_FIELD) -> ZoneInfo:
    """The IANA time zone ``name`` (UTC when empty); ``field`` names it in the error."""
    if not name:
        return ZoneInfo("UTC")
    try:
        if name != name.strip() or name.startswith(("/", ".")) or ".." in name:
            raise ValueError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidSchedule(
            field,
            f"{field}: {name!r} is not a known IANA time zone (such as Europe/Paris, "
            "America/New_York or UTC)",
        ) from None


def parse(
    expression: str,
    time_zone: str | None = None,
    *,
    field: str = FIELD,
    zone_field: str = ZONE_FIELD,
) -> Cron:
    """A ``Cron`` from an expression and a time zone; ``ScheduleInvalid`` naming ``field``
    (the expression's) or ``zone_field`` if not."""
    FIELD = field
    if not isinstance(expression, str):
        raise InvalidSchedule(FIELD, f"{FIELD}: {expression!r} is not a cron expression (text)")
    text = " ".join(expression.split())
    head = text.split(" ", 1)[0].upper()
    if head.startswith(("CRON_TZ=", "TZ=")):
        raise InvalidSchedule(
            FIELD, f"{FIELD}: {head.split('=')[0]}= is not supported here; set {zone_field}"
        )
    if text.startswith("@"):
        if text.lower().startswith("@every"):
            raise InvalidSchedule(FIELD, f"{FIELD}: @every is not supported; write the fields")
        if text.lower() not in MACROS:
            known = ", ".join(MACROS)
            raise InvalidSchedule(FIELD, f"{FIELD}: unknown macro {text!r} (known: {known})")
        text = MACROS[text.lower()]
    fields = text.split(" ") if text else []
    if len(fields) == 5:
        fields = ["0", *fields]
    elif len(fields) != 6:
        raise InvalidSchedule(
            FIELD,
            f"{FIELD}: {expression!r} has {len(fields)} fields; write 5 (minute hour "
            "day-of-month month day-of-week), 6 (seconds first) or a macro such as @daily",
        )
    parsed = [_field(f, i, expression, FIELD) for i, f in enumerate(fields)]
    (sec, _), (minute, _), (hour, _), (days, day_star), (months, _), (weekdays, wd_star) = parsed
    # When both day fields must match, some month must have such a day.
    if (day_star or wd_star) and not any(d <= _MONTH_DAYS[m - 1] for m in months for d in days):
        raise InvalidSchedule(
            FIELD, f"{FIELD}: {expression!r} never fires (no such day in those months)"
        )
    return Cron(
        expression=expression,
        seconds=tuple(sorted(sec)),
        minutes=tuple(sorted(minute)),
        hours=tuple(sorted(hour)),
        days=days,
        months=months,
        weekdays=weekdays,
        day_star=day_star,
        weekday_star=wd_star,
        zone=zone(time_zone, zone_field),
    )
