"""WAL checkpoints for the local World, off the writer's path.

SQLite's automatic checkpoint runs inside the commit that crosses its threshold
and fsyncs the WAL and the database file there, so one commit in a few hundred
took milliseconds (two thirds of an append's mean cost). The database thread's
connection turns it off (``PRAGMA wal_autocheckpoint = 0``) and this
``Checkpointer`` runs a PASSIVE checkpoint on a connection and thread of its
own after every ``EVERY_COMMITS`` writes, while commits go on. When a checkpoint
leaves the WAL longer than ``RESTART_ABOVE_FRAMES`` (writes never paused long
enough for it to catch up) it runs a RESTART checkpoint, which briefly holds
writers back so the WAL starts over: the file stays bounded under any load.
Durability is unchanged: a commit is in the WAL either way.

Used by ``database.Database``.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

log = logging.getLogger("treadle.worlds.local.checkpoint")

EVERY_COMMITS = 256
RESTART_ABOVE_FRAMES = 16_384  # 64 MiB of 4 KiB pages
BUSY_TIMEOUT_MS = 5000


class Checkpointer:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="treadle-ckpt")
        self._conn: sqlite3.Connection | None = None
        self._running: asyncio.Future[None] | None = None
        self._changes = 0
        self._since = 0

    def after_call(self, conn: sqlite3.Connection) -> bool:
        """On the database thread after each call: True when a checkpoint is due."""
        changes = conn.total_changes
        if changes != self._changes:
            self._changes = changes
            self._since += 1
        return self._since >= EVERY_COMMITS

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the event loop: start a checkpoint unless one is running."""
        if self._running is not None and not self._running.done():
            return
        self._since = 0
        self._running = loop.run_in_executor(self._executor, self._checkpoint)
        self._running.add_done_callback(_report)

    def _checkpoint(self) -> None:
        if self._conn is None:
            self._conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _busy, frames, _done = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if frames > RESTART_ABOVE_FRAMES:
            log.info("WAL at %d frames after a passive checkpoint; restarting it", frames)
            self._conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()

    async def settled(self) -> None:
        """Return once no checkpoint is running."""
        if self._running is not None:
            await asyncio.wait([self._running])

    async def close(self) -> None:
        await self.settled()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close_sync)
        self._executor.shutdown(wait=True)

    def _close_sync(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _report(done: asyncio.Future[None]) -> None:
    if not done.cancelled() and (exc := done.exception()) is not None:
        log.warning("WAL checkpoint failed (the next one tries again): %s", exc)
