"""Migration 0004 (one outcome per step, one completion per wait, one payload per hook)
upgrades a database that 0001-0003 made, leaving its history as it was.

Audit F2, Bugs 6 and 10; DESIGN.md 10. The rules themselves are pinned on every World by
the conformance suite (``treadle.world.conformance.storage``, ``storage_views``).
"""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg
import pytest

from treadle import errors
from treadle.world import events, ids
from treadle.worlds.postgres import PostgresStorage
from treadle.worlds.postgres import migrate as migrate_module


async def _append(conn: asyncpg.Connection, run_id: str, event: events.Event) -> None:
    """An out-of-band write through the 0001 append function, as treadle makes it."""
    await conn.fetch(
        "SELECT * FROM treadle_append($1, ARRAY[$2::jsonb], false, NULL, NULL, NULL, NULL, "
        "false, 64)",
        run_id,
        event.model_dump_json(),
    )


async def test_0004_upgrades_a_0003_database_and_then_refuses_second_outcomes(
    empty_dsn: str,
) -> None:
    """A 0003 database accepted a second step outcome (F2); after `treadle migrate` the
    stored history is unchanged, a further outcome and a second wait completion are
    refused allocating nothing, and a hook's payload frees its token."""
    migrations = migrate_module.load_migrations()
    assert [m.name for m in migrations][3] == "one_outcome"
    conn = await asyncpg.connect(empty_dsn)
    run_id = ids.new_run_id()
    try:
        assert await migrate_module._apply(conn, migrations[:3], "the test database") == [1, 2, 3]
        created = events.RunCreated(
            workflow_name="wf", input=None, deployment_id="d", spec_version=9
        )
        await conn.fetch(
            "SELECT * FROM treadle_create_run($1, $2::jsonb)", run_id, created.model_dump_json()
        )
        for result in ("first", "second"):  # 0003 stores both: the F2 defect
            late = events.StepCompleted(correlation_id="s1", step_name="f", result=result)
            await _append(conn, run_id, late)
        due = datetime(2030, 1, 1, tzinfo=UTC)
        await _append(conn, run_id, events.WaitCreated(correlation_id="w1", resume_at=due))
        await _append(conn, run_id, events.WaitCompleted(correlation_id="w1"))
        await _append(conn, run_id, events.HookCreated(correlation_id="h1", token="tok"))
    finally:
        await conn.close()
    assert await migrate_module.migrate(empty_dsn) == list(
        range(4, migrate_module.latest_version() + 1)
    )
    async with await PostgresStorage.connect(empty_dsn) as storage:
        before = await storage.events.list(run_id)
        assert [e.type for e in before.events].count("step_completed") == 2  # history kept
        with pytest.raises(errors.StepAlreadyEnded) as refused:
            await storage.events.create(
                run_id, events.StepFailed(correlation_id="s1", step_name="f", attempt=2,
                                          error=events.ErrorInfo(message="late")),
                in_band=False,
            )  # fmt: skip
        assert (refused.value.outcome_slot, refused.value.event_type) == (2, "step_failed")
        with pytest.raises(errors.WaitAlreadyCompleted):
            await storage.events.create(
                run_id, events.WaitCompleted(correlation_id="w1"), in_band=False
            )
        await storage.events.create(
            run_id, events.HookReceived(correlation_id="h1", payload=1), in_band=False
        )
        with pytest.raises(errors.HookNotFound):
            await storage.hooks.get_by_token("tok")
        after = await storage.events.list(run_id)
        assert after.snapshot.seq == before.snapshot.seq + 1
