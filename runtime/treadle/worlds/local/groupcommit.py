"""Group commit: the database thread runs the calls that queued up as one transaction.

``GroupCommit`` owns the thread that serves ``Database.call`` (a plain thread
woken through a ``SimpleQueue``: an executor's per-call future, condition and
thread bookkeeping cost more than a small write).

``Database.call`` hands ``GroupCommit.submit`` a function of the connection.
Calls that arrive while the database thread is busy wait in a queue, and the
thread takes them all at once: a lone call runs as it is (its own
``transaction`` is its commit); several run under one ``BEGIN IMMEDIATE``,
each inside a savepoint of its own (``database.transaction`` turns into one
when a transaction is open), so a call that raises rolls back only its own
writes, and one ``COMMIT`` ends the group. No caller hears back before that
commit: a result is never seen before it is durable, and if the commit fails
every call of the group gets the error. The results go back to the event loop
in one hop. Under load this turns many small commits (each taking the write
lock, writing its WAL frames, and making the thread wait for the GIL between
statements) into a few larger ones.

Used by ``database.Database``.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

from treadle.worlds.local.checkpoint import Checkpointer

Call = tuple[Callable[[sqlite3.Connection], Any], "asyncio.Future[Any]"]
Outcome = tuple["asyncio.Future[Any]", bool, Any]


class GroupCommit:
    def __init__(self, conn: sqlite3.Connection, checkpointer: Checkpointer) -> None:
        self._conn = conn
        self._checkpointer = checkpointer
        self._pending: collections.deque[Call] = collections.deque()
        self._lock = threading.Lock()
        self._draining = False
        # The database thread: woken with the loop to answer on, or None to stop.
        self._wakeups: queue.SimpleQueue[asyncio.AbstractEventLoop | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="treadle-sqlite", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (loop := self._wakeups.get()) is not None:
            self._drain(loop)

    async def close(self) -> None:
        """Stop the thread once every call handed over so far has been answered."""
        self._wakeups.put(None)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    def submit(
        self, fn: Callable[[sqlite3.Connection], Any], loop: asyncio.AbstractEventLoop
    ) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            self._pending.append((fn, future))
            if self._draining:
                return future
            self._draining = True
        self._wakeups.put(loop)
        return future

    def _take(self) -> list[Call]:
        with self._lock:
            calls = list(self._pending)
            self._pending.clear()
            if not calls:
                self._draining = False
            return calls

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the database thread: run groups until nothing waits."""
        while calls := self._take():
            outcomes = self._run_one(calls[0]) if len(calls) == 1 else self._run_group(calls)
            due = self._checkpointer.after_call(self._conn)
            try:
                loop.call_soon_threadsafe(_settle, outcomes, self._checkpointer if due else None)
            except RuntimeError:  # the loop closed under us: nobody is waiting any more
                return

    def _run_one(self, call: Call) -> list[Outcome]:
        fn, future = call
        try:
            return [(future, True, fn(self._conn))]
        except BaseException as exc:
            return [(future, False, exc)]

    def _run_group(self, calls: list[Call]) -> list[Outcome]:
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            return [(future, False, exc) for _fn, future in calls]
        outcomes: list[Outcome] = []
        for index, call in enumerate(calls):
            outcomes += self._run_one(call)
            if not conn.in_transaction:
                # An error (a full disk, say) rolled the whole group back: the calls before
                # share that error; the ones after run alone.
                error = outcomes[-1][2] if not outcomes[-1][1] else _rolled_back()
                failed: list[Outcome] = [(future, False, error) for future, _ok, _v in outcomes]
                return failed + [o for rest in calls[index + 1 :] for o in self._run_one(rest)]
        try:
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return [(future, False, exc) for _fn, future in calls]
        return outcomes


def _rolled_back() -> sqlite3.OperationalError:
    return sqlite3.OperationalError("the group's transaction was rolled back")


def _settle(outcomes: list[Outcome], checkpointer: Checkpointer | None) -> None:
    """On the event loop: hand each caller its result or error."""
    for future, ok, value in outcomes:
        if future.cancelled():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
    if checkpointer is not None:
        checkpointer.start(asyncio.get_running_loop())
