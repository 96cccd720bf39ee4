"""The local World's files: what opening a wrong, corrupt, newer or held one says."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from treadle import errors
from treadle.world import messages
from treadle.worlds.local import LocalWorld
from treadle.worlds.local.database import DATABASE_FILE, SCHEMA_VERSION


async def test_a_foreign_sqlite_database_is_refused_untouched(tmp_path: Path) -> None:
    """A SQLite file that is not treadle's is named as foreign and left as it was."""
    tmp_path.joinpath("w").mkdir()
    foreign = tmp_path / "w" / DATABASE_FILE
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE invoices (id INTEGER)")
    conn.commit()
    conn.close()
    before = foreign.read_bytes()
    with pytest.raises(errors.IncompatibleStorage, match="does not belong to treadle"):
        await LocalWorld(tmp_path / "w").open()
    assert foreign.read_bytes() == before


async def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    """Garbage where the database should be gives a clear error, not a traceback."""
    tmp_path.joinpath("w").mkdir()
    (tmp_path / "w" / DATABASE_FILE).write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(errors.IncompatibleStorage, match="not a usable treadle local World"):
        await LocalWorld(tmp_path / "w").open()


async def test_a_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    """The World path names a directory; a file there is an error naming it."""
    (tmp_path / "w").write_text("x")
    with pytest.raises(errors.IncompatibleStorage, match="is a file, not a directory"):
        await LocalWorld(tmp_path / "w").open()


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    """A database written by a newer treadle is not opened by an older one."""
    world = await LocalWorld(tmp_path / "w").open()
    await world.close()
    conn = sqlite3.connect(tmp_path / "w" / DATABASE_FILE)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(errors.IncompatibleStorage, match="newer than this treadle"):
        await LocalWorld(tmp_path / "w").open()


async def test_a_second_consumer_is_refused_while_the_first_serves(tmp_path: Path) -> None:
    """Many processes may open a World; one at a time consumes its queue (StorageLocked)."""
    first = await LocalWorld(tmp_path / "w").open()
    second = await LocalWorld(tmp_path / "w").open()
    try:
        consumer = await first.queue.consume({"step": _never})
        with pytest.raises(errors.StorageLocked, match="being served by another process"):
            await second.queue.consume({"step": _never})
        run = await second.runs.create(
            workflow_name="wf", input=None, deployment_id="d", spec_version=9
        )
        assert (await first.runs.get(run.run_id)).run_id == run.run_id
        await consumer.close()
    finally:
        await first.close()
    try:
        await (await second.queue.consume({"step": _never})).close()
    finally:
        await second.close()


async def _never(message: object, meta: object) -> messages.HandlerResult:
    raise AssertionError("no message was sent")


async def test_a_closed_world_refuses_calls(tmp_path: Path) -> None:
    """After close, calls fail with StorageUnavailable instead of hanging."""
    world = await LocalWorld(tmp_path / "w").open()
    runs = world.runs
    await world.close()
    with pytest.raises(errors.StorageUnavailable, match="closed"):
        await runs.list()


async def test_a_version_1_database_is_upgraded_in_place(tmp_path: Path) -> None:
    """A World written before deployments were recorded gains the table when opened."""
    world = await LocalWorld(tmp_path / "w").open()
    run = await world.runs.create(workflow_name="wf", input=None, deployment_id="d", spec_version=9)
    await world.close()
    conn = sqlite3.connect(tmp_path / "w" / DATABASE_FILE)
    conn.execute("DROP TABLE deployments")
    # A version 1 database has none of the later runs columns (child workflows' parent link).
    conn.execute("ALTER TABLE runs DROP COLUMN parent_run_id")
    conn.execute("ALTER TABLE runs DROP COLUMN parent_correlation_id")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    async with LocalWorld(tmp_path / "w") as reopened:
        assert (await reopened.runs.get(run.run_id)).run_id == run.run_id
        await reopened.deployments.register("d")
        assert await reopened.deployments.latest() == "d"
