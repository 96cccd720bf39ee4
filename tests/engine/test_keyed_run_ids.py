"""A run recorded under a keyed run id (issue 11 item 2: the operator names a
WorkflowRun's run by namespace, name and run key) runs like any other, on both Worlds,
and its workflow clock starts when its run_created was recorded: the id carries no time
(its ULID time field is zero), so replay must not read 1970 from it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import treadle
from treadle.client import start_run
from treadle.world import ids

from .conftest import BOTH_FORMATS, MakeApp

pytestmark = BOTH_FORMATS


async def test_a_keyed_run_runs_and_its_clock_starts_when_it_was_recorded(
    make_app: MakeApp,
) -> None:
    app = make_app()

    @app.workflow
    async def clocked() -> str:
        return treadle.now().isoformat()

    world = await app.world()
    run_id = ids.keyed_run_id("team-a\0nightly\0")
    before = datetime.now(UTC)
    record = await start_run(
        world, name="clocked", data={"args": [], "kwargs": {}},
        deployment_id=app.settings.TREADLE_DEPLOYMENT_ID, spec_version=9, run_id=run_id,
    )  # fmt: skip
    started = datetime.fromisoformat(await app.get_run(run_id).result(timeout=20))
    assert started.year > 2000, "the clock did not start at the id's zero time"
    assert before - timedelta(seconds=5) <= started <= datetime.now(UTC) + timedelta(seconds=5)
    assert abs((started - record.created_at).total_seconds()) < 5
    again = await start_run(
        world, name="clocked", data={"args": [], "kwargs": {}},
        deployment_id=app.settings.TREADLE_DEPLOYMENT_ID, spec_version=9, run_id=run_id,
    )  # fmt: skip
    assert again.run_id == run_id and again.status == "completed", "the same key, the same run"
