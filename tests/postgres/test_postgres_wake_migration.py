"""Migration 0005 (a terminal run refuses a wake_requested) upgrades a 0004 database.

Simulation seeds 215, 336, 338: a ``wake_up()`` after the run ended left a
``wake_requested`` after its terminal event. The rule itself is pinned on every World
by the conformance suite (``treadle.world.conformance.storage``).
"""

from __future__ import annotations

import asyncpg
import pytest

from treadle import errors
from treadle.world import events, ids
from treadle.worlds.postgres import PostgresStorage
from treadle.worlds.postgres import migrate as migrate_module


async def _append(conn: asyncpg.Connection, run_id: str, event: events.Event) -> None:
    """An out-of-band write through the append function, as treadle makes it."""
    await conn.fetch(
        "SELECT * FROM treadle_append($1, ARRAY[$2::jsonb], false, NULL, NULL, NULL, NULL, "
        "false, 64)",
        run_id,
        event.model_dump_json(),
    )


async def test_0005_refuses_a_wake_requested_on_an_ended_run(empty_dsn: str) -> None:
    """A 0004 database stores a wake_requested after run_completed; after `treadle
    migrate` the history is kept and a further one is RunExpired, allocating nothing."""
    migrations = migrate_module.load_migrations()
    assert [m.name for m in migrations][4] == "wake_on_ended_run"
    conn = await asyncpg.connect(empty_dsn)
    run_id = ids.new_run_id()
    try:
        assert await migrate_module._apply(conn, migrations[:4], "the test database") == [
            1,
            2,
            3,
            4,
        ]
        created = events.RunCreated(
            workflow_name="wf", input=None, deployment_id="d", spec_version=9
        )
        await conn.fetch(
            "SELECT * FROM treadle_create_run($1, $2::jsonb)", run_id, created.model_dump_json()
        )
        await _append(conn, run_id, events.RunCompleted(output=None))
        await _append(conn, run_id, events.WakeRequested())  # 0004 stores it: the defect
    finally:
        await conn.close()
    assert await migrate_module.migrate(empty_dsn) == list(
        range(5, migrate_module.latest_version() + 1)
    )
    async with await PostgresStorage.connect(empty_dsn) as storage:
        before = await storage.runs.get(run_id)
        listed = await storage.events.list(run_id)
        assert [e.type for e in listed.events][-2:] == ["run_completed", "wake_requested"]
        with pytest.raises(errors.RunExpired) as refused:
            await storage.events.create(run_id, events.WakeRequested(), in_band=False)
        assert (refused.value.status, refused.value.event_type) == ("completed", "wake_requested")
        assert (await storage.runs.get(run_id)).seq == before.seq
