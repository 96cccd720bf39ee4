"""A local World from before child workflows gains the runs' parent-link columns when
opened (schema upgrade, ``treadle.worlds.local.database.UPGRADES``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from treadle.worlds.local import LocalWorld
from treadle.worlds.local.database import DATABASE_FILE, UPGRADES

# The upgrade that adds the parent link (its number is the integrator's to choose).
CHILDREN_UPGRADE = next(
    v for v, stmts in UPGRADES.items() if any("parent_run_id" in s for s in stmts)
)


async def test_a_database_without_the_parent_link_is_upgraded_in_place(tmp_path: Path) -> None:
    world = await LocalWorld(tmp_path / "w").open()
    old = await world.runs.create(workflow_name="wf", input=None, deployment_id="d", spec_version=9)
    await world.close()
    conn = sqlite3.connect(tmp_path / "w" / DATABASE_FILE)
    conn.execute("ALTER TABLE runs DROP COLUMN parent_run_id")
    conn.execute("ALTER TABLE runs DROP COLUMN parent_correlation_id")
    conn.execute(f"PRAGMA user_version = {CHILDREN_UPGRADE - 1}")
    conn.commit()
    conn.close()
    async with LocalWorld(tmp_path / "w") as reopened:
        assert (await reopened.runs.get(old.run_id)).parent_run_id is None
        child = await reopened.runs.create(
            workflow_name="kid", input=None, deployment_id="d", spec_version=9,
            parent_run_id=old.run_id, parent_correlation_id="child_1",
        )  # fmt: skip
        got = await reopened.runs.get(child.run_id)
        assert (got.parent_run_id, got.parent_correlation_id) == (old.run_id, "child_1")
