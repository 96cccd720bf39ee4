"""``treadle schedules ...`` (issue 17 item 3): list, get, pause, resume, trigger, backfill,
upcoming and delete on the World's schedules, as a real subprocess; no worker runs, so
a firing's run stays pending where the test can read it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from tests.cli.conftest import Cli, one_error_line

from treadle import Workflows
from treadle.schedules import firing
from treadle.world import ids


def _make_schedule(cli: Cli) -> None:
    async def make() -> None:
        app = Workflows(world=cli.world, worker=False)

        @app.workflow
        async def hi(name: str) -> str:
            return name

        try:
            await app.schedule("nightly", hi, cron="0 2 * * *", timezone="Europe/Paris",
                               kwargs={"name": "cron"})  # fmt: skip
        finally:
            await app.close()

    asyncio.run(make())


def test_the_schedules_commands_read_and_act_on_the_worlds_schedules(cli: Cli) -> None:
    _make_schedule(cli)
    (listed,) = cli.json("schedules", "list")
    assert (listed["name"], listed["workflow"], listed["cron"], listed["timezone"]) == (
        "nightly", "hi", "0 2 * * *", "Europe/Paris",
    )  # fmt: skip
    assert listed["overlap"] == "skip" and listed["paused"] is False
    table = cli("schedules", "list")
    assert "nightly" in table.stdout and "NEXT (UTC)" in table.stdout

    upcoming = cli.json("schedules", "upcoming", "nightly", "--count", "2",
                        "--after", "2026-12-04T10:00:00Z")  # fmt: skip
    assert upcoming == ["2026-12-05T01:00:00.000Z", "2026-12-06T01:00:00.000Z"]

    assert cli.json("schedules", "pause", "nightly")["paused"] is True
    assert cli.json("schedules", "get", "nightly")["paused"] is True
    assert cli.json("schedules", "resume", "nightly")["paused"] is False

    triggered = cli.json("schedules", "trigger", "nightly")
    run_id = triggered["run_id"]
    assert ids.is_keyed_run_id(run_id)
    run = cli.json("runs", "get", run_id)
    assert run["status"] == "pending" and run["attributes"]["treadle.schedule"] == "nightly"
    # skip: the triggered run is still pending (no worker), so a second trigger is skipped
    again = cli.json("schedules", "trigger", "nightly")
    assert again["run_id"] is None and again["skipped"] == 1

    done = cli.json("schedules", "backfill", "nightly", "2026-01-01T00:00:00Z",
                    "2026-01-03T00:00:00Z", "--overlap", "allow")  # fmt: skip
    assert done == [
        {"time": "2026-01-01T01:00:00.000Z", "decision": "start"},
        {"time": "2026-01-02T01:00:00.000Z", "decision": "start"},
    ]
    first = firing.run_id_for("nightly", datetime(2026, 1, 1, 1, tzinfo=UTC))
    assert cli.json("runs", "get", first)["status"] == "pending"

    backwards = cli("schedules", "backfill", "nightly", "2026-01-03T00:00:00Z",
                    "2026-01-01T00:00:00Z")  # fmt: skip
    assert backwards.returncode == 2
    assert "end:" in one_error_line(backwards) and "before" in one_error_line(backwards)
    bad_time = cli("schedules", "backfill", "nightly", "yesterday", "2026-01-01T00:00:00Z")
    assert bad_time.returncode == 2 and "start:" in one_error_line(bad_time)

    missing = cli("schedules", "get", "nope")
    assert missing.returncode == 2 and "no schedule named 'nope'" in one_error_line(missing)

    assert cli("schedules", "delete", "nightly").stdout == "schedule nightly deleted\n"
    assert cli("schedules", "delete", "nightly").returncode == 2
    assert cli.json("schedules", "list") == []
