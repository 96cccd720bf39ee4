"""Schedules in the World (issue 17 item 3; docs/schedules.md), on both real Worlds.

Each test runs on the local World and on Postgres + NATS. The workflows' steps run in
this process, so a test waits on their asyncio events (a firing's run started, a gate
opened), never a fixed sleep. Overlap, trigger and backfill use a yearly cron that
never fires during a test, so only the test's own firings happen; the cron tests fire
every second; the catch-up test moves a schedule's state back as a stopped worker
would have left it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from treadle import Workflows, errors
from treadle.schedules import firing
from treadle.world import records

from .conftest import MakeApp

YEARLY = "0 0 1 1 *"
FAST = {"TREADLE_SCHEDULES_RESCAN_SECONDS": 0.5}


class Gates:
    """The steps' side of a test: who started, and gates that hold a run in its step."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.changed = asyncio.Event()
        self.gates: dict[str, asyncio.Event] = {}

    def gate(self, tag: str) -> asyncio.Event:
        return self.gates.setdefault(tag, asyncio.Event())

    async def wait_started(self, count: int, timeout: float = 30) -> list[str]:
        async with asyncio.timeout(timeout):
            while len(self.started) < count:
                self.changed.clear()
                await self.changed.wait()
        return list(self.started)


def app_with(make_app: MakeApp, gates: Gates, **overrides: Any) -> Workflows:
    app = make_app(**{**FAST, **overrides})

    @app.step(max_retries=0)
    async def held(tag: str) -> str:
        gates.started.append(tag)
        gates.changed.set()
        if tag.startswith("hold"):
            await gates.gate(tag).wait()
        return tag

    @app.workflow
    async def job(tag: str) -> str:
        return await held(tag)

    return app


async def runs_of(app: Workflows, name: str) -> list[records.RunRecord]:
    world = await app.world()
    page = await world.runs.list(workflow_name="job", limit=1000)
    return [r for r in page.runs if r.attributes.get("treadle.schedule") == name]


async def test_a_schedule_fires_each_cron_time_once_with_the_keyed_run_id(
    make_app: MakeApp,
) -> None:
    gates = Gates()
    app = app_with(make_app, gates)
    schedule = await app.schedule("every-second", "job", cron="* * * * * *", overlap="allow",
                                  kwargs={"tag": "tick"})  # fmt: skip
    await gates.wait_started(2)
    await schedule.pause()
    record = await schedule.get()
    assert record.state.paused
    fired = await runs_of(app, "every-second")
    assert len(fired) >= 2
    for run in fired:
        at = datetime.fromisoformat(str(run.attributes["treadle.scheduled_at"]))
        assert at.microsecond == 0, "a cron firing is at a whole second"
        assert run.run_id == firing.run_id_for("every-second", at)
    times = sorted(str(r.attributes["treadle.scheduled_at"]) for r in fired)
    assert len(set(times)) == len(times), "one run per firing time"
    last = max(datetime.fromisoformat(t) for t in times)
    assert record.state.last_fired_at is not None and record.state.last_fired_at >= last
    for run in fired:
        assert await app.get_run(run.run_id).result(timeout=30) == "tick"


async def test_a_paused_schedule_does_not_fire_and_resumes_from_now(make_app: MakeApp) -> None:
    gates = Gates()
    app = app_with(make_app, gates)
    schedule = await app.schedule("paused", "job", cron="* * * * * *", kwargs={"tag": "p"},
                                  paused=True)  # fmt: skip
    loop = app._worker._schedules  # type: ignore[union-attr]
    assert loop is not None
    created = datetime.now(UTC)
    passes = loop.passes
    async with asyncio.timeout(30):  # passes made after two cron times went by
        while loop.passes < passes + 3 or datetime.now(UTC) < created + timedelta(seconds=2):
            loop.passed.clear()
            await loop.passed.wait()
    assert await runs_of(app, "paused") == []
    resumed = await schedule.resume()
    assert not resumed.state.paused
    assert resumed.state.next_fire_at is not None
    assert resumed.state.next_fire_at > datetime.now(UTC) - timedelta(seconds=1)
    await gates.wait_started(1)
    fired = await runs_of(app, "paused")
    assert all(
        datetime.fromisoformat(str(r.attributes["treadle.scheduled_at"])) >= created for r in fired
    )


async def test_skip_drops_a_firing_while_the_last_run_is_running(make_app: MakeApp) -> None:
    gates = Gates()
    app = app_with(make_app, gates)
    schedule = await app.schedule("skipper", "job", cron=YEARLY, overlap="skip",
                                  kwargs={"tag": "hold-skip"})  # fmt: skip
    first = await schedule.trigger()
    assert first is not None
    await gates.wait_started(1)
    assert await schedule.trigger() is None
    assert (await schedule.get()).state.skipped == 1
    gates.gate("hold-skip").set()
    assert await first.result(timeout=30) == "hold-skip"
    third = await schedule.trigger()
    assert third is not None and third.run_id != first.run_id
    assert await third.result(timeout=30) == "hold-skip"
    assert len(await runs_of(app, "skipper")) == 2


async def test_buffer_one_starts_one_held_firing_when_the_last_run_ends(make_app: MakeApp) -> None:
    gates = Gates()
    app = app_with(make_app, gates)
    schedule = await app.schedule("buffered", "job", cron=YEARLY, overlap="buffer_one",
                                  kwargs={"tag": "hold-buf"})  # fmt: skip
    first = await schedule.trigger()
    assert first is not None
    await gates.wait_started(1)
    assert await schedule.trigger() is None  # buffered
    held = (await schedule.get()).state.buffered_at
    assert held is not None
    assert await schedule.trigger() is None  # a second one while one is buffered: dropped
    state = (await schedule.get()).state
    assert (state.buffered_at, state.skipped) == (held, 1)
    gates.gate("hold-buf").set()
    await first.result(timeout=30)
    await gates.wait_started(2)  # the loop started the buffered firing once the first ended
    second = app.get_run(firing.run_id_for("buffered", held))
    assert await second.result(timeout=30) == "hold-buf"
    state = (await schedule.get()).state
    assert state.buffered_at is None and state.last_run_id == second.run_id
    assert len(await runs_of(app, "buffered")) == 2


async def test_allow_runs_firings_side_by_side(make_app: MakeApp) -> None:
    gates = Gates()
    app = app_with(make_app, gates)
    schedule = await app.schedule("allowed", "job", cron=YEARLY, overlap="allow",
                                  kwargs={"tag": "hold-allow"})  # fmt: skip
    first = await schedule.trigger()
    await gates.wait_started(1)
    second = await schedule.trigger()
    await gates.wait_started(2)  # both in their step at once
    assert first is not None and second is not None and first.run_id != second.run_id
    gates.gate("hold-allow").set()
    assert [await r.result(timeout=30) for r in (first, second)] == ["hold-allow"] * 2


async def test_cancel_other_cancels_the_running_run_and_starts(make_app: MakeApp) -> None:
    gates = Gates()
    app = app_with(make_app, gates)
    schedule = await app.schedule("canceller", "job", cron=YEARLY, overlap="cancel_other",
                                  kwargs={"tag": "hold-cancel"})  # fmt: skip
    first = await schedule.trigger()
    assert first is not None
    await gates.wait_started(1)
    second = await schedule.trigger()
    assert second is not None
    with pytest.raises(errors.RunCancelledError):
        await first.result(timeout=30)
    await gates.wait_started(2)
    gates.gate("hold-cancel").set()
    assert await second.result(timeout=30) == "hold-cancel"
    assert (await schedule.get()).state.previous_run_id == first.run_id


async def test_backfill_fires_each_time_of_a_range_once(make_app: MakeApp) -> None:
    gates = Gates()
    app = app_with(make_app, gates)
    schedule = await app.schedule("hourly", "job", cron="0 * * * *", kwargs={"tag": "bf"})
    start, end = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 3, tzinfo=UTC)
    done = await schedule.backfill(start, end, overlap="allow")
    times = [start + timedelta(hours=h) for h in range(4)]
    assert done == [(t, "start") for t in times]
    for t in times:
        assert await app.get_run(firing.run_id_for("hourly", t)).result(timeout=30) == "bf"
    again = await schedule.backfill("2026-01-01T00:00:00Z", "2026-01-01T03:00:00+00:00",
                                    overlap="allow")  # fmt: skip
    assert [t for t, _ in again] == times
    assert len(await runs_of(app, "hourly")) == 4, "a retried backfill starts nothing twice"
    with pytest.raises(errors.ScheduleInvalid) as backwards:
        await schedule.backfill(end, start)
    assert backwards.value.field == "end" and "before" in str(backwards.value)


async def test_backfill_under_skip_starts_the_first_and_skips_the_overlapping(
    make_app: MakeApp,
) -> None:
    gates = Gates()
    app = app_with(make_app, gates)
    schedule = await app.schedule("bf-skip", "job", cron="0 * * * *",
                                  kwargs={"tag": "hold-bf"})  # fmt: skip
    done = await schedule.backfill("2026-01-01T00:00:00Z", "2026-01-01T02:30:00Z")
    assert [d for _, d in done] == ["start", "skip", "skip"]
    assert (await schedule.get()).state.skipped == 2
    gates.gate("hold-bf").set()
    (run,) = await runs_of(app, "bf-skip")
    assert run.run_id == firing.run_id_for("bf-skip", datetime(2026, 1, 1, tzinfo=UTC))


async def test_upcoming_lists_the_next_firings_in_the_time_zone(make_app: MakeApp) -> None:
    app = app_with(make_app, Gates())
    schedule = await app.schedule("weekday-mornings", "job", cron="30 9 * * MON-FRI",
                                  timezone="Europe/Paris", kwargs={"tag": "x"})  # fmt: skip
    after = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)  # a Friday, 11:00 in Paris
    assert await schedule.upcoming(3, after=after) == [
        datetime(2026, 12, 7, 8, 30, tzinfo=UTC),
        datetime(2026, 12, 8, 8, 30, tzinfo=UTC),
        datetime(2026, 12, 9, 8, 30, tzinfo=UTC),
    ]
    assert len(await schedule.upcoming()) == 5


async def test_after_downtime_it_fires_what_the_catchup_window_allows(
    make_app: MakeApp,
) -> None:
    """A worker stopped for four hours: the firings older than the window are skipped and
    counted as missed; those within it fire, under the overlap policy (allow: each)."""
    gates = Gates()
    stopped = app_with(make_app, gates, TREADLE_SCHEDULES_ENABLED=False)
    now = datetime.now(UTC)
    hour = now.replace(minute=0, second=0, microsecond=0)
    window = (now - (hour - timedelta(hours=2))) + timedelta(minutes=30)  # back to hour-2.5h
    schedule = await stopped.schedule("hourly-catchup", "job", cron="0 * * * *",
                                      overlap="allow", catchup_window=window,
                                      kwargs={"tag": "caught"})  # fmt: skip
    world = await stopped.world()
    table = world.schedules  # type: ignore[attr-defined]
    record = await schedule.get()
    down = dataclasses.replace(record.state, next_fire_at=hour - timedelta(hours=4))
    assert await table.update(record.name, expected_version=record.version, state=down)
    assert await runs_of(stopped, "hourly-catchup") == [], "no firing loop ran"
    await stopped.close()
    await stopped._world_arg.close()  # type: ignore[union-attr]

    restarted = app_with(make_app, gates)
    await restarted.world()  # the worker starts, its loop looks at once
    await gates.wait_started(3)
    fired = sorted(
        datetime.fromisoformat(str(r.attributes["treadle.scheduled_at"]))
        for r in await runs_of(restarted, "hourly-catchup")
    )
    assert fired == [hour - timedelta(hours=2), hour - timedelta(hours=1), hour]
    state = (await restarted.get_schedule("hourly-catchup").get()).state
    assert state.missed == 2
    assert state.next_fire_at == hour + timedelta(hours=1)


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ({"cron": "61 * * * *"}, "cron", "out of range"),
        ({"cron": "* * *"}, "cron", "fields"),
        ({"timezone": "Mars/Olympus_Mons"}, "timezone", "time zone"),
        ({"overlap": "sometimes"}, "overlap", "buffer_one"),
        ({"catchup_window": -5}, "catchup_window", "positive"),
        ({"workflow": "nope"}, "workflow", "no workflow named 'nope'"),
        ({"name": "bad name!"}, "name", "schedule name"),
    ],
)
async def test_bad_input_is_refused_at_the_call_naming_the_field(
    make_app: MakeApp, options: dict[str, Any], field: str, words: str
) -> None:
    app = app_with(make_app, Gates())
    args: dict[str, Any] = {"cron": "0 * * * *", "kwargs": {"tag": "x"}, **options}
    name = args.pop("name", "refused")
    workflow = args.pop("workflow", "job")
    with pytest.raises(errors.ScheduleInvalid) as refused:
        await app.schedule(name, workflow, **args)
    assert refused.value.field == field
    assert words in str(refused.value) and field in str(refused.value)
    assert await app.list_schedules() == [], "nothing recorded"


async def test_an_update_by_name_replaces_the_spec_and_delete_removes_it(
    make_app: MakeApp,
) -> None:
    app = app_with(make_app, Gates())
    first = await (await app.schedule("report", "job", cron=YEARLY, kwargs={"tag": "a"})).get()
    second = await (
        await app.schedule("report", "job", cron="0 6 * * *", overlap="allow", kwargs={"tag": "b"})
    ).get()
    assert second.version > first.version and second.created_at == first.created_at
    assert (second.spec.cron, second.spec.overlap) == ("0 6 * * *", "allow")
    assert second.spec.input == {"args": [], "kwargs": {"tag": "b"}}
    assert [r.name for r in await app.list_schedules()] == ["report"]
    assert await app.get_schedule("report").delete() is True
    with pytest.raises(errors.ScheduleNotFound):
        await app.get_schedule("report").get()


async def test_catchup_latest_fires_only_the_latest_due_time_and_counts_the_rest(
    make_app: MakeApp,
) -> None:
    """``catchup="latest"`` (Kubernetes CronJob's rule, the operator's WorkflowSchedule):
    after four hours down, of the firings within the window only the newest fires; those
    older than the window and those passed over are all counted in ``missed``."""
    gates = Gates()
    stopped = app_with(make_app, gates, TREADLE_SCHEDULES_ENABLED=False)
    now = datetime.now(UTC)
    hour = now.replace(minute=0, second=0, microsecond=0)
    window = (now - (hour - timedelta(hours=2))) + timedelta(minutes=30)
    schedule = await stopped.schedule("latest-catchup", "job", cron="0 * * * *",
                                      overlap="allow", catchup_window=window, catchup="latest",
                                      kwargs={"tag": "newest"})  # fmt: skip
    record = await schedule.get()
    assert record.spec.catchup == "latest", "the option is stored"
    world = await stopped.world()
    table = world.schedules  # type: ignore[attr-defined]
    down = dataclasses.replace(record.state, next_fire_at=hour - timedelta(hours=4))
    assert await table.update(record.name, expected_version=record.version, state=down)
    await stopped.close()
    await stopped._world_arg.close()  # type: ignore[union-attr]

    restarted = app_with(make_app, gates)
    await restarted.world()
    await gates.wait_started(1)
    loop = restarted._worker._schedules  # type: ignore[union-attr]
    passes = loop.passes
    async with asyncio.timeout(30):  # two more passes: nothing else fires
        while loop.passes < passes + 2:
            loop.passed.clear()
            loop.wake()
            await loop.passed.wait()
    fired = [
        datetime.fromisoformat(str(r.attributes["treadle.scheduled_at"]))
        for r in await runs_of(restarted, "latest-catchup")
    ]
    assert fired == [hour]
    state = (await restarted.get_schedule("latest-catchup").get()).state
    assert state.missed == 4  # hour-4, hour-3 (older than the window), hour-2, hour-1
    assert state.next_fire_at == hour + timedelta(hours=1)


async def test_catchup_latest_resume_fires_the_latest_time_passed_over_while_paused(
    make_app: MakeApp,
) -> None:
    """Under ``catchup="latest"`` a resume fires the newest time passed over while paused
    (CronJob's ``suspend``), once; under ``all`` it would fire from now on."""
    gates = Gates()
    app = app_with(make_app, gates)
    schedule = await app.schedule("resumed-latest", "job", cron="0 * * * *", overlap="allow",
                                  catchup="latest", kwargs={"tag": "back"})  # fmt: skip
    await schedule.pause()
    world = await app.world()
    table = world.schedules  # type: ignore[attr-defined]
    record = await schedule.get()
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    held = dataclasses.replace(record.state, next_fire_at=hour - timedelta(hours=3))
    assert await table.update(record.name, expected_version=record.version, state=held)
    await schedule.resume()
    await gates.wait_started(1)
    fired = [
        datetime.fromisoformat(str(r.attributes["treadle.scheduled_at"]))
        for r in await runs_of(app, "resumed-latest")
    ]
    assert fired == [hour]
    assert (await schedule.get()).state.missed == 3


async def test_a_schedule_pinned_to_a_deployment_fires_there_and_only_its_workers_fire_it(
    make_app: MakeApp,
) -> None:
    """``deployment=``: the runs start on the named deployment, fired by its workers; a
    worker of another deployment leaves the schedule alone."""
    gates = Gates()
    app = app_with(make_app, gates)
    own = app.settings.TREADLE_DEPLOYMENT_ID
    elsewhere = await app.schedule("pinned-away", "job", cron="* * * * * *", overlap="allow",
                                   deployment="another-deployment",
                                   kwargs={"tag": "away"})  # fmt: skip
    assert (await elsewhere.get()).spec.deployment_id == "another-deployment"
    await app.schedule("pinned-here", "job", cron="* * * * * *", overlap="allow",
                       deployment=own, kwargs={"tag": "here"})  # fmt: skip
    await gates.wait_started(2)
    here = await runs_of(app, "pinned-here")
    assert here and all(r.deployment_id == own for r in here)
    assert await runs_of(app, "pinned-away") == [], "a worker fired another deployment's"
    with pytest.raises(errors.ScheduleInvalid) as refused:
        await app.schedule("bad-catchup", "job", cron=YEARLY, catchup="some")
    assert refused.value.field == "catchup"
