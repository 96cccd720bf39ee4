"""WAL checkpoints of the local World run beside its writes, never inside a commit."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from treadle.worlds.local import checkpoint
from treadle.worlds.local.database import DATABASE_FILE, Database, transaction

ROW = "x" * 2000


def _write(conn: sqlite3.Connection, key: str) -> None:
    with transaction(conn):
        conn.execute("INSERT INTO treadle_meta (key, value) VALUES (?, ?)", (key, ROW))


def _count(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM treadle_meta").fetchone()[0])


async def test_commits_leave_checkpoints_to_the_checkpointer(tmp_path: Path) -> None:
    """The writer's connection never checkpoints; after EVERY_COMMITS writes the
    checkpointer copies the WAL into the database file, and no write is lost."""
    db = await Database.open(tmp_path)
    try:
        assert await db.call(lambda c: c.execute("PRAGMA wal_autocheckpoint").fetchone()[0]) == 0
        size = (tmp_path / DATABASE_FILE).stat().st_size
        half = checkpoint.EVERY_COMMITS // 2
        for i in range(half):
            await db.call(lambda c, i=i: _write(c, f"k{i}"))
        await db.checkpointer.settled()
        assert (tmp_path / DATABASE_FILE).stat().st_size == size  # all still in the WAL
        for i in range(half, checkpoint.EVERY_COMMITS + 1):
            await db.call(lambda c, i=i: _write(c, f"k{i}"))
        await db.checkpointer.settled()
        grown = (tmp_path / DATABASE_FILE).stat().st_size
        assert grown > size + half * len(ROW)
        assert await db.call(_count) == checkpoint.EVERY_COMMITS + 2  # created_at and ours
    finally:
        await db.close()


async def test_a_long_wal_is_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A WAL still long after a passive checkpoint gets a RESTART checkpoint."""
    monkeypatch.setattr(checkpoint, "RESTART_ABOVE_FRAMES", 0)
    db = await Database.open(tmp_path)
    try:
        with caplog.at_level(logging.INFO, logger="treadle.worlds.local.checkpoint"):
            for i in range(checkpoint.EVERY_COMMITS):
                await db.call(lambda c, i=i: _write(c, f"k{i}"))
            await db.checkpointer.settled()
        assert any("restarting it" in r.getMessage() for r in caplog.records)
        assert await db.call(_count) == checkpoint.EVERY_COMMITS + 1
    finally:
        await db.close()
    conn = sqlite3.connect(tmp_path / DATABASE_FILE)
    assert _count(conn) == checkpoint.EVERY_COMMITS + 1
    conn.close()
