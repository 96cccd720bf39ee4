"""The local World's SQLite database: one connection on one thread.

Every storage and queue operation is a plain function of a ``sqlite3.Connection``
that ``Database.call`` runs on the database thread, one at a time, so nothing
blocks the event loop. Each write is one ``BEGIN IMMEDIATE`` transaction (or a
savepoint in a group commit's, see ``groupcommit``), so it is atomic against
every other writer, in this process or another (the in-band fence needs no
more than that). The file is opened in WAL mode with
``synchronous=NORMAL``: a committed transaction survives the process being
killed. Any number of processes may open a World (the CLI beside a worker);
only one at a time may consume its queue, which ``take_consumer_lock`` decides.

Called by ``storage`` and ``queue``; opened by ``LocalWorld``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import IO, TypeVar

from treadle import errors
from treadle.worlds.local import files, schedules_table
from treadle.worlds.local.checkpoint import Checkpointer
from treadle.worlds.local.groupcommit import GroupCommit
from treadle.worlds.local.limitschema import SCHEMA as LIMITS_SCHEMA

log = logging.getLogger("treadle.worlds.local")

T = TypeVar("T")

SCHEMA_VERSION = 11
# Statements that bring a database at version N - 1 to version N.
UPGRADES = {
    2: [
        "CREATE TABLE IF NOT EXISTS deployments (deployment_id TEXT PRIMARY KEY, "
        "created_at INTEGER NOT NULL, registered INTEGER NOT NULL, "
        "retired INTEGER NOT NULL DEFAULT 0)"
    ],
    3: ["ALTER TABLE deployments ADD COLUMN catalogue TEXT"],
    4: ["ALTER TABLE deployments ADD COLUMN promoted INTEGER"],
    # Searchable run attributes (issue 17 item 2, schema.sql's run_attributes), with the
    # scalar attributes runs already hold (real numbers are not carried over).
    5: [
        "CREATE TABLE IF NOT EXISTS run_attributes (run_id TEXT NOT NULL, key TEXT NOT NULL, "
        "value TEXT NOT NULL, PRIMARY KEY (run_id, key)) WITHOUT ROWID",
        "CREATE INDEX IF NOT EXISTS run_attributes_by_value ON run_attributes (key, value, run_id)",
        "INSERT OR REPLACE INTO run_attributes (run_id, key, value) SELECT r.run_id, j.key, "
        "CASE j.type WHEN 'text' THEN json_quote(j.value) WHEN 'integer' THEN "
        "CAST(j.value AS TEXT) ELSE j.type END FROM runs r, json_each(r.attributes) j "
        "WHERE j.type IN ('text', 'integer', 'true', 'false', 'null') "
        "AND coalesce(length(CAST(j.atom AS TEXT)), 0) <= 1000",
    ],
    # child workflows (docs/children.md): a child run's parent link
    6: [
        "ALTER TABLE runs ADD COLUMN parent_run_id TEXT",
        "ALTER TABLE runs ADD COLUMN parent_correlation_id TEXT",
    ],
    # Issue 17 item 3: schedules (treadle.worlds.local.schedules).
    7: [schedules_table.SCHEMA],
    8: LIMITS_SCHEMA,  # concurrency and rate limits (``limits``)
    9: [  # step heartbeats (issue 17 item 5)
        "CREATE TABLE IF NOT EXISTS step_heartbeats (run_id TEXT NOT NULL, "
        "step_id TEXT NOT NULL, attempt INTEGER NOT NULL, details TEXT, "
        "beat_at INTEGER NOT NULL, PRIMARY KEY (run_id, step_id))"
    ],
    # Issue 17 item 6: streams (worlds/local/streams.py).
    10: [
        "CREATE TABLE IF NOT EXISTS streams (run_id TEXT NOT NULL, name TEXT NOT NULL, "
        "count INTEGER NOT NULL, closed INTEGER NOT NULL, PRIMARY KEY (run_id, name)) "
        "WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS stream_chunks (run_id TEXT NOT NULL, name TEXT NOT NULL, "
        "idx INTEGER NOT NULL, step_id TEXT NOT NULL, attempt INTEGER NOT NULL, "
        "seq INTEGER NOT NULL, data TEXT NOT NULL, created_at INTEGER NOT NULL, "
        "PRIMARY KEY (run_id, name, idx)) WITHOUT ROWID",
        "CREATE UNIQUE INDEX IF NOT EXISTS stream_chunks_by_attempt ON stream_chunks "
        "(run_id, name, step_id, attempt, seq)",
    ],
    # Hook token retention (issue 17 item 8).
    11: [
        "CREATE TABLE IF NOT EXISTS hook_retention (token TEXT PRIMARY KEY, "
        "retain_until INTEGER NOT NULL) WITHOUT ROWID"
    ],
}
# "trdl": marks a SQLite file as a treadle local World.
APPLICATION_ID = 0x7472646C
DATABASE_FILE = "treadle.db"
LOCK_FILE = "treadle.lock"
INIT_LOCK_FILE = "treadle.init.lock"


def now_us() -> int:
    return time.time_ns() // 1000


# (begin, commit, roll back) of a write transaction, and of one nested in a group commit's.
_OWN = ("BEGIN IMMEDIATE", ("COMMIT",), ("ROLLBACK",))
_NESTED = ("SAVEPOINT call", ("RELEASE call",), ("ROLLBACK TO call", "RELEASE call"))


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A write transaction: taken at BEGIN, committed on success, rolled back on error.

    Inside a group commit's transaction it is a savepoint: its writes commit with the
    group's, and an error rolls back only them (``groupcommit``).
    """
    begin, commit, roll_back = _NESTED if conn.in_transaction else _OWN
    conn.execute(begin)
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:  # an error SQLite rolled back itself leaves nothing to undo
            for statement in roll_back:
                conn.execute(statement)
        raise
    for statement in commit:
        conn.execute(statement)


class Database:
    """A SQLite database served by one thread."""

    def __init__(
        self, directory: Path, conn: sqlite3.Connection, executor: ThreadPoolExecutor
    ) -> None:
        self.directory = directory
        self._conn = conn
        self._lock: IO[str] | None = None
        self._executor = executor
        self.checkpointer = Checkpointer(directory / DATABASE_FILE)
        self._group = GroupCommit(conn, self.checkpointer)
        self._data_version: int | None = None
        self._closed = False

    @classmethod
    async def open(cls, directory: Path) -> Database:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="treadle-sqlite")
        loop = asyncio.get_running_loop()
        try:
            conn = await loop.run_in_executor(executor, _open_sync, directory)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(directory, conn, executor)

    async def take_consumer_lock(self) -> None:
        """Become the one process that consumes this World's queue (``StorageLocked`` if not)."""
        if self._lock is None:
            loop = asyncio.get_running_loop()
            path = self.directory / LOCK_FILE
            self._lock = await loop.run_in_executor(self._executor, _take_lock, path)

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on the database thread and return its result."""
        if self._closed:
            raise errors.StorageUnavailable(f"the local World at {self.directory} is closed")
        try:
            result: T = await self._group.submit(fn, asyncio.get_running_loop())
        except sqlite3.DatabaseError as exc:
            raise errors.StorageUnavailable(
                f"the local World at {self.directory} failed: {exc}"
            ) from exc
        return result

    async def external_writes(self) -> bool:
        """True when another connection (another process) committed since the last call."""
        version = await self.call(_data_version)
        changed = version != self._data_version
        self._data_version = version
        return changed

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await self._group.close()
        await self.checkpointer.close()
        await loop.run_in_executor(self._executor, _close_sync, self._conn, self._lock)
        self._lock = None
        self._executor.shutdown(wait=True)


def _data_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


def _open_sync(directory: Path) -> sqlite3.Connection:
    if directory.exists() and not directory.is_dir():
        raise errors.IncompatibleStorage(
            f"cannot open a local World at {directory}: it is a file, not a directory"
        )
    files.prepare_directory(directory)
    # Two processes opening a new World at once must not both create its schema.
    init_fd = files.open_private(directory / INIT_LOCK_FILE, os.O_WRONLY | os.O_APPEND)
    with os.fdopen(init_fd, "a") as init_lock:
        fcntl.flock(init_lock.fileno(), fcntl.LOCK_EX)
        files.prepare_database(directory / DATABASE_FILE)
        conn = _connect(directory / DATABASE_FILE)
        files.tighten_database(directory / DATABASE_FILE)
    conn.execute("PRAGMA wal_autocheckpoint = 0")  # the Checkpointer runs them, off this thread
    return conn


def _take_lock(path: Path) -> IO[str]:
    # Never through a symlink: one planted here used to be truncated and overwritten.
    handle = os.fdopen(files.open_private(path, os.O_RDWR), "r+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise errors.StorageLocked(
            f"the local World at {path.parent} is being served by another process "
            f"(pid {holder}); one worker at a time consumes a local World's queue"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def _connect(path: Path) -> sqlite3.Connection:
    existed = path.exists() and path.stat().st_size > 0
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        application_id = conn.execute("PRAGMA application_id").fetchone()[0]
        if existed and application_id != APPLICATION_ID:
            raise errors.IncompatibleStorage(
                f"{path} is a SQLite database that does not belong to treadle "
                f"(application_id {application_id:#x}); refusing to touch it"
            )
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA busy_timeout = 5000")
        if not existed:
            _create_schema(conn)
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise errors.IncompatibleStorage(
                f"{path} has schema version {version}, newer than this treadle's "
                f"{SCHEMA_VERSION}; upgrade treadle to open it"
            )
        if version < SCHEMA_VERSION:
            _upgrade(conn, version)
        integrity = conn.execute("PRAGMA quick_check").fetchone()[0]
        if integrity != "ok":
            raise errors.IncompatibleStorage(f"{path} is corrupt: {integrity}")
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise errors.IncompatibleStorage(
            f"{path} is not a usable treadle local World database: {exc}"
        ) from exc
    except BaseException:
        conn.close()
        raise
    return conn


def _create_schema(conn: sqlite3.Connection) -> None:
    text = resources.files("treadle.worlds.local").joinpath("schema.sql").read_text()
    schema = re.sub(r"--[^\n]*", "", text)
    with transaction(conn):
        for statement in schema.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(
            "INSERT INTO treadle_meta (key, value) VALUES ('created_at', ?)", (str(now_us()),)
        )
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    log.debug("created local World schema v%d at %s", SCHEMA_VERSION, conn)


def _upgrade(conn: sqlite3.Connection, version: int) -> None:
    with transaction(conn):
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for statement in UPGRADES[target]:
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    log.info("upgraded local World schema from v%d to v%d", version, SCHEMA_VERSION)


def _close_sync(conn: sqlite3.Connection, lock: IO[str] | None) -> None:
    try:
        conn.close()
    finally:
        if lock is not None:
            lock.close()
