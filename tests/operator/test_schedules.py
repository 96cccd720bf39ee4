"""WorkflowSchedule rules with explicit times (issue 11 item 7, issue 17 item 3): the cron
syntax CronJob users write, time zones across DST; the CRD's mapping onto a World schedule
(concurrencyPolicy, suspend, startingDeadlineSeconds, catch-up ``latest``, the pinned
revision), a fired run's mirror (name, labels, owner), history limits, status; and run
attributes as labels (issue 17 item 2). No API server: tests/k8s/
test_operator_schedules.py runs them against one, with the World's workers firing."""

from __future__ import annotations

import dataclasses
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from treadle.world import records
from treadle_operator import attrlabels, binding, cron, schedules, schedulesync
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


def test_the_crd_maps_onto_a_world_schedule_with_cronjob_catchup() -> None:
    """Allow/Forbid/Replace are allow/skip/cancel_other; suspend pauses; the deadline is the
    catch-up window (unset: a year; 0: one second) with catchup latest; the runs are pinned
    to the revision; the World schedule is <namespace>.<name>."""
    made, c = schedulesync._checked(
        "shop.nightly",
        spec(concurrencyPolicy="Replace", startingDeadlineSeconds=300, suspend=True,
             timeZone="Europe/Paris", runTemplate={"deployment": "shop", "workflow": "greet",
                                                   "input": {"name": "x"}}),
        "shop-abc123", {"greet": {}},
    )  # fmt: skip
    assert isinstance(made, records.ScheduleSpec)
    assert (made.name, made.workflow_name, made.cron, made.timezone) == (
        "shop.nightly",
        "greet",
        "*/5 * * * *",
        "Europe/Paris",
    )
    assert (made.overlap, made.catchup, made.catchup_window_seconds) == ("cancel_other", "latest",
                                                                         300.0)  # fmt: skip
    assert (made.paused, made.deployment_id) == (True, "shop-abc123")
    assert made.input == {"args": [], "kwargs": {"name": "x"}}
    assert str(c.zone) == "Europe/Paris"
    for policy, overlap in (("Allow", "allow"), ("Forbid", "skip")):
        got, _ = schedulesync._checked("a.b", spec(concurrencyPolicy=policy), "r", None)
        assert got.overlap == overlap
    assert schedules.window_seconds(spec()) == 365 * 86400
    assert schedules.window_seconds(spec(startingDeadlineSeconds=0)) == 1
    assert schedules.world_name("ns", "a.b") == "ns.a.b"
    assert schedules.of_world_name("ns.a.b") == ("ns", "a.b")
    assert schedules.of_world_name("plain") is None


@pytest.mark.parametrize(
    ("fields", "reason", "starts"),
    [
        ({"schedule": "61 * * * *"}, "InvalidSchedule", "spec.schedule: "),
        ({"timeZone": "Mars/Olympus_Mons"}, "UnknownTimeZone", "spec.timeZone: "),
        ({"runTemplate": {"deployment": "shop", "workflow": "nope"}}, "UnknownWorkflow",
         "spec.runTemplate.workflow: no workflow named 'nope'"),
        ({"runTemplate": {"deployment": "shop", "workflow": "greet", "input": 5}},
         "InvalidInput", "spec.runTemplate.input: "),
    ],
)  # fmt: skip
def test_a_spec_the_world_refuses_is_a_reason_naming_the_crd_field(
    fields: dict[str, Any], reason: str, starts: str
) -> None:
    with pytest.raises(schedulesync._Refused) as refused:
        schedulesync._checked("shop.x", spec(**fields), "r", {"greet": {}})
    assert refused.value.reason == reason
    assert str(refused.value).startswith(starts), str(refused.value)


def fired(name: str, at: datetime, **attributes: Any) -> records.RunRecord:
    stamp = at.isoformat(timespec="milliseconds")
    return records.RunRecord(
        run_id="wrun_fired", workflow_name="greet", deployment_id="shop-rev", status="pending",
        input=None, created_at=at, updated_at=at, spec_version=1, seq=1, seq_in_band=1,
        attributes={"treadle.schedule": name, "treadle.scheduled_at": stamp, **attributes},
    )  # fmt: skip


def test_a_fired_run_is_mirrored_as_its_schedules_workflowrun_named_by_the_time() -> None:
    body = {"metadata": {"name": "nightly", "namespace": "shop", "uid": "u-1"},
            "spec": {"schedule": "@daily", "runTemplate": {
                "deployment": "shop", "workflow": "greet", "input": {"name": "x"},
                "ttlSecondsAfterFinished": 60}}}  # fmt: skip
    at = utc(2026, 12, 1, 2, 30)
    run = fired("shop.nightly", at, customer="acme")
    mirror = schedules.mirror_body(body, run, at)
    meta = mirror["metadata"]
    assert meta["name"] == f"nightly-{int(at.timestamp())}"
    assert meta["labels"] == {
        "treadle.dev/schedule": "nightly",
        "attr.treadle.dev/customer": "acme",
        "attr.treadle.dev/treadle.schedule": "shop.nightly",
    }  # treadle.scheduled_at holds ':' and '+': no label value
    assert meta["annotations"] == {
        "treadle.dev/mirrored-run": "wrun_fired",
        "treadle.dev/scheduled-time": "2026-12-01T02:30:00Z",
    }
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("WorkflowSchedule", "u-1", True)
    assert mirror["spec"] == {"deployment": "shop", "workflow": "greet", "input": {"name": "x"},
                              "ttlSecondsAfterFinished": 60}  # fmt: skip
    assert schedules.mirror_of(run) == ("shop", meta["name"])
    wfd = {"status": {"revisions": [{"id": "shop-rev"}]}}
    assert binding.refusal(run, mirror, wfd) is None
    elsewhere = {**mirror, "metadata": {**meta, "namespace": "other"}}
    assert binding.refusal(run, elsewhere, wfd) is not None, "another namespace's schedule"
    renamed = {**mirror, "metadata": {**meta, "name": "nightly-1"}}
    assert binding.refusal(run, renamed, wfd) is not None, "another firing's name"


def test_history_limits_keep_the_newest_completed_and_failed_runs() -> None:
    runs = [
        ScheduledRun(f"r{i}", f"u{i}", utc(2026, 1, 1, 0, i), phase)
        for i, phase in enumerate(
            ["Completed", "Failed", "Completed", "Cancelled", "Completed", "Running", "Failed"]
        )
    ]
    assert schedules.prune(runs, 2, 1) == ("r0", "r1", "r3")
    assert schedules.prune(runs, 0, 0) == ("r0", "r1", "r2", "r3", "r4", "r6")


def test_status_is_the_world_schedules_state_and_the_mirrors() -> None:
    state = records.ScheduleState(
        paused=False, next_fire_at=utc(2026, 1, 1, 0, 10), last_fired_at=utc(2026, 1, 1, 0, 5),
        last_run_id="wrun_5", skipped=2, missed=3,
    )  # fmt: skip
    made, _ = schedulesync._checked("shop.s", spec(), "rev", None)
    record = records.ScheduleRecord(made, state, 4, utc(2026, 1, 1), utc(2026, 1, 1))
    mirrors = [
        ScheduledRun("s-1", "u1", utc(2026, 1, 1, 0, 0), "Completed", utc(2026, 1, 1, 0, 1)),
        ScheduledRun("s-2", "u2", utc(2026, 1, 1, 0, 5), "Running"),
    ]
    status = schedules.status_of(WorkflowScheduleStatus(), 7, record, mirrors,
                                 last_mirrored=utc(2026, 1, 1, 0, 5))  # fmt: skip
    assert (status.world_schedule, status.revision, status.last_run_id) == ("shop.s", "rev",
                                                                            "wrun_5")  # fmt: skip
    assert status.last_schedule_time == "2026-01-01T00:05:00Z"
    assert status.next_schedule_time == "2026-01-01T00:10:00Z"
    assert status.last_successful_time == "2026-01-01T00:01:00Z"
    assert (status.missed_schedules, status.skipped_schedules) == (3, 2)
    assert [a.name for a in status.active] == ["s-2"] and status.active_count == 1
    ready = {c.type: c for c in status.conditions}["Ready"]
    assert (ready.status, ready.reason, ready.observed_generation) == ("True", "Scheduled", 7)
    paused = dataclasses.replace(record, state=dataclasses.replace(state, paused=True))
    held = schedules.status_of(status, 8, paused, mirrors, last_mirrored=None)
    assert held.next_schedule_time is None
    assert {c.type: c for c in held.conditions}["Ready"].reason == "Suspended"


def test_a_name_too_long_for_its_runs_is_refused_naming_metadata_name() -> None:
    assert schedules.name_problem("x" * 52) is None
    said = schedules.name_problem("x" * 53)
    assert said is not None and said.startswith("metadata.name: ")


def test_attributes_that_fit_labels_are_shown_under_the_prefix_and_the_rest_skipped() -> None:
    shown = attrlabels.labels({
        "customer": "acme", "tier": 2, "vip": True, "ratio": 0.5, "region.eu": "west-1",
        "has/slash": "x", "with space": "x", "long": "v" * 64, "empty": "", "colon": "a:b",
        "list": [1], "obj": {"a": 1}, "none": None, "neg": -1, "k" * 64: "x",
    })  # fmt: skip
    assert shown == {
        "attr.treadle.dev/customer": "acme", "attr.treadle.dev/tier": "2",
        "attr.treadle.dev/vip": "true", "attr.treadle.dev/ratio": "0.5",
        "attr.treadle.dev/region.eu": "west-1", "attr.treadle.dev/empty": "",
    }  # fmt: skip
    many = attrlabels.labels({f"k{i:03}": "v" for i in range(100)})
    assert len(many) == attrlabels.MAX_LABELS and "attr.treadle.dev/k000" in many
    have = {"attr.treadle.dev/gone": "x", "attr.treadle.dev/customer": "old", "other": "y"}
    assert attrlabels.wanted(have, {"customer": "acme"}) == {
        "attr.treadle.dev/customer": "acme", "attr.treadle.dev/gone": None
    }  # fmt: skip


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


def test_an_unchanged_input_under_payload_keys_is_not_put_again() -> None:
    """Under a deployment's payload keys each encoding of the input differs (a new nonce):
    a sync keeps the stored encoding when it decodes to the same arguments, so an
    unchanged WorkflowSchedule writes nothing; a changed input is put."""
    from treadle import payloads

    def checked(name: str) -> records.ScheduleSpec:
        template = {"deployment": "shop", "workflow": "greet", "input": {"name": name}}
        made, _ = schedulesync._checked("shop.s", spec(runTemplate=template), "r", None)
        return made

    payloads.use(payloads.KeyRing.parse(payloads.new_key("k1")))  # as world_of does
    try:
        first, again, other = checked("x"), checked("x"), checked("y")
        assert first.input != again.input, "sealed: each encoding differs"
        assert schedulesync._same_input(first, again) == first
        assert schedulesync._same_input(first, other) == other
    finally:
        payloads.use(None)
