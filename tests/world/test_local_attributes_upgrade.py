"""The local World's attribute index upgrade (issue 17 item 2): the ``UPGRADES`` step
that adds ``run_attributes`` fills it from the scalar attributes runs already hold, so a
World created before it answers ``runs.list(attributes=...)`` for its old runs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from treadle.world import events
from treadle.worlds.local import LocalWorld
from treadle.worlds.local.database import DATABASE_FILE, UPGRADES


async def test_the_upgrade_indexes_the_attributes_runs_already_hold(tmp_path: Path) -> None:
    world = await LocalWorld(tmp_path / "w").open()
    made = {}
    for name, seeded in (
        ("gold", {"tier": "gold", "n": 3, "on": True, "none": None, "doc": {"a": 1}}),
        ("silver", {"tier": "silver", "n": "3"}),
    ):
        run = await world.runs.create(
            workflow_name="wf", input=None, deployment_id="d", spec_version=9,
            attributes=seeded,
        )  # fmt: skip
        made[name] = run.run_id
    await world.events.create(
        made["silver"], events.AttrSet(key="tier", value="gold"), in_band=False
    )
    await world.close()
    # The database as it was before the upgrade: no run_attributes.
    (version,) = [v for v, stmts in UPGRADES.items() if any("run_attributes" in s for s in stmts)]
    conn = sqlite3.connect(tmp_path / "w" / DATABASE_FILE)
    conn.execute("DROP TABLE run_attributes")
    for statement in UPGRADES[version]:
        conn.execute(statement)
    conn.commit()
    rows = sorted(conn.execute("SELECT run_id, key, value FROM run_attributes").fetchall())
    conn.close()
    assert (made["gold"], "doc", '{"a":1}') not in rows  # objects are never indexed
    world = await LocalWorld(tmp_path / "w").open()
    try:

        async def found(**wanted: object) -> set[str]:
            page = await world.runs.list(attributes=wanted)  # type: ignore[arg-type]
            return {r.run_id for r in page.runs}

        assert await found(tier="gold") == {made["gold"], made["silver"]}
        assert await found(n=3) == {made["gold"]}
        assert await found(n="3") == {made["silver"]}
        assert await found(on=True) == {made["gold"]}
        assert await found(none=None) == {made["gold"]}
    finally:
        await world.close()
