"""Migration 0006 (a stale step_started is refused) upgrades a 0005 database.

Simulation seed 522: a plain delivery's out-of-band ``step_started`` stalled past its
lease and landed as attempt 1 after its redeliveries had started attempts 1 and 2. The
rule itself is pinned on every World by the conformance suite
(``treadle.world.conformance.storage``).
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


def _start(attempt: int) -> events.StepStarted:
    return events.StepStarted(correlation_id="s1", step_name="fetch", attempt=attempt)


async def test_0006_refuses_a_stale_step_started(empty_dsn: str) -> None:
    """A 0005 database stores a step_started of attempt 1 after attempt 2; after
    `treadle migrate` the history is kept, a further stale start is StaleStepStart
    allocating nothing, and the next attempt is taken."""
    migrations = migrate_module.load_migrations()
    assert [m.name for m in migrations][5] == "stale_step_start"
    conn = await asyncpg.connect(empty_dsn)
    run_id = ids.new_run_id()
    try:
        applied = await migrate_module._apply(conn, migrations[:5], "the test database")
        assert applied == [1, 2, 3, 4, 5]
        created = events.RunCreated(
            workflow_name="wf", input=None, deployment_id="d", spec_version=9
        )
        await conn.fetch(
            "SELECT * FROM treadle_create_run($1, $2::jsonb)", run_id, created.model_dump_json()
        )
        await _append(conn, run_id, events.StepCreated(correlation_id="s1", step_name="fetch"))
        await _append(conn, run_id, _start(2))
        await _append(conn, run_id, _start(1))  # 0005 stores it: the defect
    finally:
        await conn.close()
    assert await migrate_module.migrate(empty_dsn) == list(
        range(6, migrate_module.latest_version() + 1)
    )
    async with await PostgresStorage.connect(empty_dsn) as storage:
        listed = await storage.events.list(run_id)
        starts = [e.event for e in listed.events if isinstance(e.event, events.StepStarted)]
        assert [s.attempt for s in starts] == [2, 1]  # history kept
        before = await storage.runs.get(run_id)
        with pytest.raises(errors.StaleStepStart) as refused:
            await storage.events.create(run_id, _start(2), in_band=False)
        assert (refused.value.step_id, refused.value.attempt) == ("s1", 2)
        assert refused.value.latest_attempt == 2
        assert (await storage.runs.get(run_id)).seq == before.seq
        taken = await storage.events.create(run_id, _start(3), in_band=False)
        assert taken.event.slot == before.seq + 1
