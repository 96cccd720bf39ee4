"""WorkflowSchedule rules with explicit times (issue 11 item 7; review operator.md §1 row
"Schedules / cron", §2 (d)): the cron syntax CronJob users write, time zones across DST,
missed firings and startingDeadlineSeconds, concurrency policies, history limits, and the
firing's WorkflowRun (name, run key, owner). No API server: tests/k8s/
test_operator_schedules.py runs the same rules against one."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from treadle_operator import binding, cron, schedules
from treadle_operator.errors import InvalidSchedule
from treadle_operator.schedulemodels import WorkflowScheduleSpec, WorkflowScheduleStatus
from treadle_operator.schedules import ScheduledRun


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def firings(c: cron.Cron, after: datetime, count: int) -> list[datetime]:
    out: list[datetime] = []
    t = after
    for _ in range(count):
        found = c.next_after(t)
        assert found is not None
        out.append(found)
        t = found
    return out


def spec(**fields: Any) -> WorkflowScheduleSpec:
    body = {"schedule": "*/5 * * * *", "runTemplate": {"deployment": "shop", "workflow": "greet"}}
    return WorkflowScheduleSpec.model_validate({**body, **fields})


# -- syntax ---------------------------------------------------------------------------------


def test_five_fields_macros_names_ranges_and_steps_fire_when_cronjob_would() -> None:
    assert firings(cron.parse("*/20 9-10 * * MON-FRI"), utc(2026, 12, 4, 10, 30), 3) == [
        utc(2026, 12, 4, 10, 40),
        utc(2026, 12, 7, 9, 0),
        utc(2026, 12, 7, 9, 20),
    ]  # fmt: skip  (Friday 10:40, then Monday)
    assert cron.parse("@daily").next_after(utc(2026, 1, 1, 0, 0)) == utc(2026, 1, 2)
    assert cron.parse("@hourly").next_after(utc(2026, 1, 1, 5, 59, 59)) == utc(2026, 1, 1, 6)
    assert cron.parse("@weekly").next_after(utc(2026, 12, 1)) == utc(2026, 12, 6)  # a Sunday
    assert cron.parse("@monthly").next_after(utc(2026, 12, 1)) == utc(2027, 1, 1)
    assert cron.parse("@yearly").next_after(utc(2026, 12, 1)) == cron.parse("@annually").next_after(
        utc(2026, 12, 1)
    )
    assert cron.parse("0 12 * jan,Dec 7").next_after(utc(2026, 12, 1)) == utc(2026, 12, 6, 12)
    assert cron.parse("5/20 * * * *").minutes == (5, 25, 45)
    assert cron.parse("0 0 1-10/3 * ?").days == frozenset({1, 4, 7, 10})


def test_a_leading_seconds_field_fires_every_few_seconds() -> None:
    c = cron.parse("*/2 * * * * *")
    assert firings(c, utc(2026, 1, 1, 0, 0, 0), 3) == [
        utc(2026, 1, 1, 0, 0, 2), utc(2026, 1, 1, 0, 0, 4), utc(2026, 1, 1, 0, 0, 6),
    ]  # fmt: skip
    # "after" is strict, and sub-second times round down first
    assert c.next_after(utc(2026, 1, 1, 0, 0, 1).replace(microsecond=999_000)) == utc(
        2026, 1, 1, 0, 0, 2
    )


def test_both_day_fields_restricted_match_either_and_a_star_makes_them_both_needed() -> None:
    either = cron.parse("0 0 13 * FRI")  # the 13th, or any Friday (cron's OR)
    assert firings(either, utc(2026, 12, 1), 3) == [
        utc(2026, 12, 4), utc(2026, 12, 11), utc(2026, 12, 13),
    ]  # fmt: skip
    both = cron.parse("0 0 */1 * FRI")  # starts with '*': a Friday that is any day (AND)
    assert firings(both, utc(2026, 12, 1), 2) == [utc(2026, 12, 4), utc(2026, 12, 11)]


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("61 * * * *", "minute field '61'"),
        ("* * *", "has 3 fields"),
        ("*/0 * * * *", "step '0'"),
        ("0 0 10-2 * *", "runs backwards"),
        ("0 0 * FOO *", "'FOO' is not a number"),
        ("CRON_TZ=UTC 0 0 * * *", "set spec.timeZone"),
        ("@every 5m", "@every is not supported"),
        ("@fortnightly", "unknown macro"),
        ("0 0 30 2 *", "never fires"),
        ("0 ? * * *", "only for the day fields"),
        ("² * * * *", "is not a number"),
        ("*/٣ * * * *", "must be a number"),
    ],
)
def test_a_bad_schedule_is_one_line_naming_spec_schedule(expression: str, says: str) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        cron.parse(expression)
    assert caught.value.field == "spec.schedule"
    message = str(caught.value)
    assert message.startswith("spec.schedule: ") and says in message and "\n" not in message


@pytest.mark.parametrize("name", ["Mars/Olympus_Mons", "../etc/passwd", "Europe/"])
def test_an_unknown_time_zone_names_spec_time_zone(name: str) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        cron.parse("0 0 * * *", name)
    assert caught.value.field == "spec.timeZone"
    assert str(caught.value).startswith("spec.timeZone: ") and "IANA" in str(caught.value)


def test_the_schema_refuses_what_its_pattern_can_see() -> None:
    """The CRD's pattern (RE2 there, the same expression here) refuses a wrong field count."""
    with pytest.raises(ValueError, match="schedule"):
        spec(schedule="* * *")
    with pytest.raises(ValueError, match=r"timeZone|time_zone"):
        spec(timeZone="Europe/Paris; rm")
    assert spec(schedule="@daily", timeZone="America/Argentina/Buenos_Aires").time_zone


# -- time zones and DST ---------------------------------------------------------------------


def test_a_time_zone_moves_the_firing_with_daylight_saving() -> None:
    paris = cron.parse("0 9 * * *", "Europe/Paris")
    assert paris.next_after(utc(2026, 1, 10)) == utc(2026, 1, 10, 8)  # CET, UTC+1
    assert paris.next_after(utc(2026, 7, 10)) == utc(2026, 7, 10, 7)  # CEST, UTC+2


def test_a_local_time_skipped_by_spring_forward_does_not_fire_that_day() -> None:
    """As CronJob (robfig/cron): 02:30 does not exist in New York on 8 March 2026."""
    c = cron.parse("30 2 * * *", "America/New_York")
    assert firings(c, utc(2026, 3, 7, 12), 2) == [utc(2026, 3, 9, 6, 30), utc(2026, 3, 10, 6, 30)]
    hourly = cron.parse("30 * * * *", "America/New_York")
    assert firings(hourly, utc(2026, 3, 8, 6, 0), 2) == [
        utc(2026, 3, 8, 6, 30),
        utc(2026, 3, 8, 7, 30),
    ]  # fmt: skip  (01:30 EST, then 03:30 EDT)


def test_a_local_time_repeated_by_fall_back_fires_twice() -> None:
    """As CronJob (robfig/cron): 01:30 happens at 05:30 and at 06:30 UTC on 1 November 2026."""
    c = cron.parse("30 1 * * *", "America/New_York")
    assert firings(c, utc(2026, 10, 31, 12), 3) == [
        utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 6, 30), utc(2026, 11, 2, 6, 30),
    ]  # fmt: skip
    quarter = cron.parse("*/15 * * * *", "America/New_York")
    day = firings(quarter, utc(2026, 11, 1, 4, 0) - timedelta(seconds=1), 100)
    assert day[0] == utc(2026, 11, 1, 4) and day[-1] == utc(2026, 11, 2, 4, 45)
    assert all(b - a == timedelta(minutes=15) for a, b in itertools.pairwise(day))


# -- missed firings and the deadline ----------------------------------------------------------


def test_latest_counts_to_one_hundred_then_says_more_and_still_finds_the_latest() -> None:
    c = cron.parse("* * * * *")
    assert c.latest(utc(2026, 1, 1), utc(2026, 1, 1, 0, 5, 30)) == (utc(2026, 1, 1, 0, 5), 5)
    latest, count = c.latest(utc(2026, 1, 1), utc(2026, 1, 3, 7, 8, 9))
    assert (latest, count) == (utc(2026, 1, 3, 7, 8), 101)
    assert c.latest(utc(2026, 1, 1), utc(2026, 1, 1, 0, 0, 59)) == (None, 0)


def test_after_downtime_only_the_latest_missed_firing_fires_and_the_rest_are_counted() -> None:
    p = schedules.plan(
        spec(), cron.parse("*/5 * * * *"), last_schedule=utc(2026, 1, 1, 10, 0),
        created=utc(2026, 1, 1), runs=[], now=utc(2026, 1, 1, 10, 21),
    )  # fmt: skip
    assert (p.fire, p.missed, p.skipped) == (utc(2026, 1, 1, 10, 20), 3, None)
    assert p.next_time == utc(2026, 1, 1, 10, 25)
    ran = [_run("s-10-05", utc(2026, 1, 1, 10, 5), "Completed")]  # made, status unwritten
    p = schedules.plan(
        spec(), cron.parse("*/5 * * * *"), last_schedule=utc(2026, 1, 1, 10, 0),
        created=utc(2026, 1, 1), runs=ran, now=utc(2026, 1, 1, 10, 21),
    )  # fmt: skip
    assert (p.fire, p.missed) == (utc(2026, 1, 1, 10, 20), 2)


def test_a_firing_later_than_starting_deadline_seconds_is_skipped() -> None:
    c = cron.parse("*/5 * * * *")
    late = schedules.plan(
        spec(startingDeadlineSeconds=30), c, last_schedule=utc(2026, 1, 1, 10, 0),
        created=utc(2026, 1, 1), runs=[], now=utc(2026, 1, 1, 10, 21),
    )  # fmt: skip
    assert (late.fire, late.skipped, late.skipped_time) == (
        None, "DeadlineExceeded", utc(2026, 1, 1, 10, 20),
    )  # fmt: skip
    assert late.missed == 4
    in_time = schedules.plan(
        spec(startingDeadlineSeconds=90), c, last_schedule=utc(2026, 1, 1, 10, 0),
        created=utc(2026, 1, 1), runs=[], now=utc(2026, 1, 1, 10, 21),
    )  # fmt: skip
    assert in_time.fire == utc(2026, 1, 1, 10, 20)


def test_a_new_schedule_fires_nothing_for_times_before_it_was_made() -> None:
    p = schedules.plan(
        spec(), cron.parse("*/5 * * * *"), last_schedule=None,
        created=utc(2026, 1, 1, 10, 1), runs=[], now=utc(2026, 1, 1, 10, 4),
    )  # fmt: skip
    assert (p.fire, p.missed, p.next_time) == (None, 0, utc(2026, 1, 1, 10, 5))


# -- concurrency, suspend, restarts ----------------------------------------------------------


def _run(name: str, at: datetime, phase: str = "Running", **kw: Any) -> ScheduledRun:
    return ScheduledRun(name=name, uid=f"uid-{name}", scheduled=at, phase=phase, **kw)


def test_forbid_skips_while_a_run_is_active_and_fires_the_latest_once_it_ended() -> None:
    c = cron.parse("*/5 * * * *")
    active = [_run("s-1", utc(2026, 1, 1, 10, 0))]
    skipped = schedules.plan(
        spec(concurrencyPolicy="Forbid"), c, last_schedule=utc(2026, 1, 1, 10, 0),
        created=utc(2026, 1, 1), runs=active, now=utc(2026, 1, 1, 10, 5, 1),
    )  # fmt: skip
    assert (skipped.fire, skipped.skipped, skipped.missed) == (None, "Forbid", 1)
    ended = [_run("s-1", utc(2026, 1, 1, 10, 0), "Completed")]
    later = schedules.plan(  # CronJob: the skipped firing still runs, if within the deadline
        spec(concurrencyPolicy="Forbid"), c, last_schedule=utc(2026, 1, 1, 10, 0),
        created=utc(2026, 1, 1), runs=ended, now=utc(2026, 1, 1, 10, 7),
    )  # fmt: skip
    assert later.fire == utc(2026, 1, 1, 10, 5)
    final = schedules.plan(
        spec(concurrencyPolicy="Forbid", startingDeadlineSeconds=60), c,
        last_schedule=utc(2026, 1, 1, 10, 0), created=utc(2026, 1, 1), runs=ended,
        now=utc(2026, 1, 1, 10, 7),
    )  # fmt: skip
    assert (final.fire, final.skipped) == (None, "DeadlineExceeded")


def test_allow_fires_beside_an_active_run_and_replace_cancels_it_first() -> None:
    c = cron.parse("*/5 * * * *")
    runs = [
        _run("s-1", utc(2026, 1, 1, 10, 0)),
        _run("s-0", utc(2026, 1, 1, 9, 55), cancel_requested=True),
    ]
    kw: dict[str, Any] = {
        "last_schedule": utc(2026, 1, 1, 10, 0), "created": utc(2026, 1, 1), "runs": runs,
        "now": utc(2026, 1, 1, 10, 5),
    }  # fmt: skip
    allow = schedules.plan(spec(), c, **kw)
    assert (allow.fire, allow.replace) == (utc(2026, 1, 1, 10, 5), ())
    swap = schedules.plan(spec(concurrencyPolicy="Replace"), c, **kw)
    assert (swap.fire, swap.replace) == (utc(2026, 1, 1, 10, 5), ("s-1",))  # s-0: cancelling


def test_suspend_fires_nothing_has_no_next_time_and_resuming_fires_the_latest() -> None:
    c = cron.parse("*/5 * * * *")
    kw: dict[str, Any] = {
        "last_schedule": utc(2026, 1, 1, 10, 0), "created": utc(2026, 1, 1), "runs": [],
        "now": utc(2026, 1, 1, 10, 12),
    }  # fmt: skip
    held = schedules.plan(spec(suspend=True), c, **kw)
    assert (held.fire, held.skipped, held.next_time, held.missed) == (None, "Suspended", None, 2)
    quiet = schedules.plan(spec(suspend=True), c, **{**kw, "now": utc(2026, 1, 1, 10, 4)})
    assert (quiet.skipped, quiet.skipped_time, quiet.missed) == ("Suspended", None, 0)
    resumed = schedules.plan(spec(), c, **kw)
    assert (resumed.fire, resumed.missed) == (utc(2026, 1, 1, 10, 10), 1)


def test_a_run_made_for_the_latest_time_before_a_restart_is_that_firing() -> None:
    """Killed between creating the run and writing status: on restart the same time is the
    firing again (same name, same run key, same run id), never cancelled or forbidden by
    itself; creating it again is a 409 that the scheduler adopts."""
    c = cron.parse("*/5 * * * *")
    at = utc(2026, 1, 1, 10, 5)
    made = [_run("nightly-1767261900", at, "Pending")]
    for policy in ("Allow", "Forbid", "Replace"):
        p = schedules.plan(
            spec(concurrencyPolicy=policy), c, last_schedule=utc(2026, 1, 1, 10, 0),
            created=utc(2026, 1, 1), runs=made, now=utc(2026, 1, 1, 10, 5, 3),
        )  # fmt: skip
        assert (p.fire, p.replace, p.skipped) == (at, (), None), policy
    schedule = {"metadata": {"name": "nightly", "namespace": "ns", "uid": "u-1"},
                "spec": {"runTemplate": {"deployment": "shop", "workflow": "greet"}}}  # fmt: skip
    first, again = schedules.run_body(schedule, at), schedules.run_body(schedule, at)
    assert first == again
    assert first["metadata"]["name"] == "nightly-1767261900" == f"nightly-{int(at.timestamp())}"
    ids = {binding.run_id("ns", b["metadata"]["name"], b["spec"]["runKey"]) for b in (first, again)}
    assert len(ids) == 1


def test_the_firing_run_is_keyed_by_its_time_labelled_and_owned_by_the_schedule() -> None:
    at = utc(2026, 12, 1, 16, 0)
    schedule = {
        "metadata": {"name": "nightly", "namespace": "ns", "uid": "u-1"},
        "spec": {"runTemplate": {"deployment": "shop", "workflow": "greet", "cancel": True,
                                 "runKey": "mine", "input": {"name": "x"}}},
    }  # fmt: skip
    body = schedules.run_body(schedule, at)
    assert body["spec"] == {
        "deployment": "shop", "workflow": "greet", "input": {"name": "x"},
        "runKey": "2026-12-01T16:00:00Z",
    }  # fmt: skip
    assert body["metadata"]["labels"] == {"treadle.dev/schedule": "nightly"}
    assert body["metadata"]["annotations"] == {"treadle.dev/scheduled-time": "2026-12-01T16:00:00Z"}
    (owner,) = body["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "treadle.dev/v1alpha1", "kind": "WorkflowSchedule", "name": "nightly",
        "uid": "u-1", "controller": True,
    }  # fmt: skip
    assert schedules.owned_by(body, "u-1") and not schedules.owned_by(body, "u-2")
    listed = schedules.scheduled_run({**body, "metadata": {**body["metadata"], "uid": "r"}})
    assert listed == ScheduledRun("nightly-1796140800", "r", at, "Pending")


# -- history and status -----------------------------------------------------------------------


def test_history_limits_keep_the_newest_completed_and_failed_runs() -> None:
    t = [utc(2026, 1, 1, 10, m) for m in range(8)]
    runs = [
        _run("c0", t[0], "Completed"), _run("c1", t[1], "Completed"), _run("f2", t[2], "Failed"),
        _run("c3", t[3], "Completed"), _run("x4", t[4], "Cancelled"), _run("c5", t[5], "Completed"),
        _run("r6", t[6], "Running"), _run("f7", t[7], "Failed"),
    ]  # fmt: skip
    assert schedules.prune(runs, 3, 1) == ("c0", "f2", "x4")
    assert schedules.prune(runs, 0, 0) == ("c0", "c1", "f2", "c3", "x4", "c5", "f7")
    assert schedules.prune(runs, 10, 10) == ()


def test_status_reports_times_active_runs_and_conditions() -> None:
    c = cron.parse("*/5 * * * *")
    runs = [
        _run("s-a", utc(2026, 1, 1, 9, 55), "Completed", completed_at=utc(2026, 1, 1, 9, 56)),
        _run("s-b", utc(2026, 1, 1, 10, 0)),
    ]
    p = schedules.plan(
        spec(), c, last_schedule=utc(2026, 1, 1, 10, 0), created=utc(2026, 1, 1), runs=runs,
        now=utc(2026, 1, 1, 10, 1),
    )  # fmt: skip
    status = schedules.status_of(
        WorkflowScheduleStatus(), 4, plan=p, last_schedule=utc(2026, 1, 1, 10, 0)
    )
    assert status.last_schedule_time == "2026-01-01T10:00:00Z"
    assert status.last_successful_time == "2026-01-01T09:56:00Z"
    assert status.next_schedule_time == "2026-01-01T10:05:00Z"
    assert [r.name for r in status.active] == ["s-b"] and status.active_count == 1
    conditions = {c.type: (c.status, c.reason, c.observed_generation) for c in status.conditions}
    assert conditions == {
        "Ready": ("True", "Scheduled", 4), "ScheduleValid": ("True", "Valid", 4),
        "Stalled": ("False", "Valid", 4),
    }  # fmt: skip
    bad = schedules.status_of(
        status, 5, plan=None, last_schedule=None,
        problem=("UnknownTimeZone", "spec.timeZone: 'Mars/X' is not a known IANA time zone"),
    )  # fmt: skip
    conditions = {c.type: (c.status, c.reason) for c in bad.conditions}
    assert conditions == {
        "Ready": ("False", "UnknownTimeZone"), "ScheduleValid": ("False", "UnknownTimeZone"),
        "Stalled": ("True", "UnknownTimeZone"),
    }  # fmt: skip
    assert bad.next_schedule_time is None
    assert all("spec.timeZone" in c.message for c in bad.conditions)


def test_a_name_too_long_for_its_runs_is_refused_naming_metadata_name() -> None:
    assert schedules.name_problem("n" * 52) is None
    problem = schedules.name_problem("n" * 53)
    assert problem is not None and problem.startswith("metadata.name: ")


def test_the_timer_sleeps_until_the_next_firing_capped_and_not_at_all_without_one() -> None:
    now = utc(2026, 1, 1, 10, 0)
    assert schedules.wake_in(now + timedelta(seconds=2), now, 300) == pytest.approx(2.005)
    assert schedules.wake_in(now + timedelta(days=1), now, 300) == 300
    assert schedules.wake_in(now - timedelta(seconds=1), now, 300) == 0
    assert schedules.wake_in(None, now, 300) is None


async def test_a_run_changing_phase_wakes_its_schedule_and_old_bodies_never_win() -> None:
    """The timer sleeps until the next firing; a run of the schedule that appears, changes
    phase or goes wakes it at once (Forbid's late firing, history pruning), other runs
    and repeated phases do not; a watch event older than the body held is ignored."""
    from treadle_operator.scheduler import Scheduler, _Timer

    scheduler = Scheduler(state=None)  # type: ignore[arg-type]
    meta = {"name": "nightly", "namespace": "ns", "uid": "u-1", "resourceVersion": "20"}
    timer = _Timer(body={"metadata": meta})
    scheduler.timers["ns/nightly"] = timer

    def run(name: str, phase: str | None, schedule: str = "nightly") -> dict[str, Any]:
        labels = {"treadle.dev/schedule": schedule}
        body: dict[str, Any] = {"metadata": {"name": name, "namespace": "ns", "labels": labels}}
        return {**body, "status": {"phase": phase}} if phase else body

    scheduler.run_changed("ADDED", run("nightly-1", None))
    assert timer.wake.is_set()
    timer.wake.clear()
    scheduler.run_changed("MODIFIED", run("nightly-1", None))  # still Pending: no news
    scheduler.run_changed("MODIFIED", run("other-1", "Completed", schedule="other"))
    assert not timer.wake.is_set()
    scheduler.run_changed("MODIFIED", run("nightly-1", "Completed"))
    assert timer.wake.is_set()
    timer.wake.clear()
    scheduler.run_changed("DELETED", run("nightly-1", "Completed"))
    assert timer.wake.is_set() and timer.phases == {}

    scheduler.seen("MODIFIED", {"metadata": {**meta, "resourceVersion": "19"}, "spec": {"x": 1}})
    assert timer.body["metadata"]["resourceVersion"] == "20"
    scheduler.seen("MODIFIED", {"metadata": {**meta, "resourceVersion": "21"}})
    assert timer.body["metadata"]["resourceVersion"] == "21"
    scheduler.seen("DELETED", {"metadata": meta})
    assert scheduler.timers == {}


def test_any_schedule_text_parses_or_is_refused_with_a_reason_never_a_traceback() -> None:
    """Seeded fuzz over the tokens cron is made of: ``InvalidSchedule`` or a usable ``Cron``
    (whose next firing is found, or is None for one that never comes)."""
    import random

    rng = random.Random(11)
    tokens = ["*", "?", "/", "-", ",", "0", "1", "7", "12", "31", "59", "60", "99", "JAN",
              "fri", "L", "#", "@daily", "@", "x", "\u00b2", ""]  # fmt: skip
    for _ in range(3000):
        fields = [
            "".join(rng.choice(tokens) for _ in range(rng.randint(1, 4)))
            for _ in range(rng.choice((1, 5, 5, 6, 7)))
        ]
        text = " ".join(fields)
        try:
            parsed = cron.parse(text)
        except InvalidSchedule as exc:
            said = str(exc)
        else:
            said = ""
        if said:
            assert said.startswith("spec.schedule: ") and "\n" not in said, text
            continue
        found = parsed.next_after(utc(2026, 1, 1))
        assert found is None or found > utc(2026, 1, 1), text
