"""Group commit in the local World: calls that queue up share one transaction.

Each keeps its own result, a call that raises rolls back only its own writes,
and no caller hears back before the group's commit.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from treadle import errors
from treadle.worlds.local.database import DATABASE_FILE, Database, transaction


def _insert(conn: sqlite3.Connection, key: str, *, fail: bool = False) -> str:
    with transaction(conn):
        conn.execute("INSERT INTO treadle_meta (key, value) VALUES (?, 'v')", (key,))
        if fail:
            raise ValueError(f"refused {key}")
    return key


class Holder:
    """Holds the database thread (outside any transaction) until released."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, _conn: sqlite3.Connection) -> bool:
        self.started.set()
        return self.release.wait(10)

    async def hold(self, db: Database) -> asyncio.Future[bool]:
        held = asyncio.ensure_future(db.call(self))
        await asyncio.get_running_loop().run_in_executor(None, self.started.wait, 10)
        return held


def _committed_keys(directory: Path) -> set[str]:
    """What another connection sees: committed rows only."""
    conn = sqlite3.connect(directory / DATABASE_FILE)
    try:
        return {row[0] for row in conn.execute("SELECT key FROM treadle_meta")}
    finally:
        conn.close()


async def test_queued_calls_commit_together_and_a_failing_one_alone_rolls_back(
    tmp_path: Path,
) -> None:
    db = await Database.open(tmp_path)
    gate = Holder()
    try:
        # Hold the database thread so the next calls queue up behind it as one group.
        blocker = await gate.hold(db)
        calls = [
            asyncio.ensure_future(db.call(lambda c, i=i: _insert(c, f"k{i}", fail=i == 3)))
            for i in range(8)
        ]
        await asyncio.sleep(0)  # let every call reach the queue
        gate.release.set()
        assert await blocker is True
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert isinstance(results[3], ValueError) and "refused k3" in str(results[3])
        assert [r for i, r in enumerate(results) if i != 3] == [f"k{i}" for i in range(8) if i != 3]
        # Every caller that heard success is committed; the refused call left nothing.
        assert _committed_keys(tmp_path) >= {f"k{i}" for i in range(8) if i != 3}
        assert "k3" not in _committed_keys(tmp_path)
    finally:
        gate.release.set()
        await db.close()


async def test_a_group_whose_commit_fails_reports_the_error_to_every_call(
    tmp_path: Path,
) -> None:
    """If the group cannot even begin (another connection holds the write lock past the
    busy timeout), every call of it hears StorageUnavailable, and nothing is written."""
    db = await Database.open(tmp_path)
    other = sqlite3.connect(tmp_path / DATABASE_FILE, isolation_level=None)
    gate = Holder()
    try:
        await db.call(lambda c: c.execute("PRAGMA busy_timeout = 50"))
        blocker = await gate.hold(db)
        calls = [
            asyncio.ensure_future(db.call(lambda c, i=i: _insert(c, f"g{i}"))) for i in range(3)
        ]
        await asyncio.sleep(0)
        other.execute("BEGIN IMMEDIATE")  # the write lock, held by another connection
        gate.release.set()
        await blocker
        results = await asyncio.gather(*calls, return_exceptions=True)
        other.execute("ROLLBACK")
        assert all(isinstance(r, errors.StorageUnavailable) for r in results), results
        assert not {k for k in _committed_keys(tmp_path) if k.startswith("g")}
    finally:
        gate.release.set()
        other.close()
        await db.close()


@pytest.mark.parametrize("size", [1, 2])
async def test_results_arrive_after_their_commit(tmp_path: Path, size: int) -> None:
    """A lone call and a group alike: when a caller hears back, others see its write."""
    db = await Database.open(tmp_path)
    try:
        keys = await asyncio.gather(
            *(db.call(lambda c, i=i: _insert(c, f"c{i}")) for i in range(size))
        )
        assert set(keys) <= _committed_keys(tmp_path)
    finally:
        await db.close()
