"""The Postgres live feed: LISTEN/NOTIFY pushes a run's committed events in slot order.

Every transaction that appends to a run NOTIFYs ``treadle_events`` once with
``run_id:slot``, its last slot (from the append functions, so every writer's
events are announced, in any process; once per event before migration 0011): a
notification stands for every slot up to the one it names.
A ``Feed`` holds one dedicated listener connection per World, opened when the
first subscription is made. A subscription first reads what was committed
before it subscribed (after the listener is in place, so nothing falls between
the two), then reads the missing slots whenever a notification names a slot
past its cursor, and delivers in slot order. Writes made through this World are
also offered at once, without waiting for their notification; a notification
that arrives while this World's own write to the run is still returning waits
for it, and reads only if a slot it names is still missing then (the
notification of an own write used to cost a read of the log per write).

The listener connection is checked every ``HEARTBEAT_SECONDS``; when it is lost
(the server ended it, the network dropped) every subscription hears
``StorageUnavailable`` through ``on_error`` and is closed, and the next
``subscribe`` opens a new listener. Callbacks run on the event loop; an
exception in ``on_event`` is passed to ``on_error`` and delivery goes on.

The world-wide changes feed (``watch``, ``contract.Changes``) is the same
connection: every notification is reported as ``RunChanged(run_id, slot)``
(the payload ``run_id:slot`` is parsed here and nowhere else). A run's creation
is reported from ``RUNS_CHANNEL`` instead (migration 0007: ``{"run_id",
"deployment_id"}`` on each new run row), so it names the deployment; on a
database without that trigger, from its slot-1 notification, without it. While
anyone watches, a lost listener is reopened every ``RECONNECT_SECONDS`` and each
watch hears ``on_resync()`` once it is back.

Called by ``storage.PostgresEvents``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

import asyncpg

from treadle import errors
from treadle.world import changefeed, contract, events, records
from treadle.worlds.postgres.database import DRIVER_ERRORS, describe, map_error

log = logging.getLogger("treadle.worlds.postgres.feed")

CHANNEL = "treadle_events"
RUNS_CHANNEL = "treadle_runs"
_HAS_RUNS_TRIGGER = "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'treadle_runs_created')"
LISTENER_APPLICATION_NAME = "treadle-listener"
HEARTBEAT_SECONDS = 15.0
HEARTBEAT_TIMEOUT_SECONDS = 10.0
RECONNECT_SECONDS = 2.0

ListPage = Callable[[str, int], Awaitable[records.EventPage]]


class Subscription:
    def __init__(
        self,
        feed: Feed,
        run_id: str,
        after_slot: int,
        on_event: contract.EventCallback,
        on_error: contract.ErrorCallback,
    ) -> None:
        self._feed = feed
        self.run_id = run_id
        self.cursor = after_slot
        self._on_event = on_event
        self._on_error = on_error
        self._pending: dict[int, events.LoggedEvent] = {}
        # The highest slot known to exist (notified or offered); read while it is ahead.
        self._wanted = 0
        self._news = asyncio.Event()
        self._news.set()
        self._initial = True  # read what was committed before we subscribed
        self.closed = False
        self._task = asyncio.get_running_loop().create_task(
            self._follow(), name=f"treadle-pg-feed-{run_id}"
        )

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._feed.remove(self)
        self._task.cancel()

    def notified(self, slot: int) -> None:
        if slot > self.cursor:
            self._wanted = max(self._wanted, slot)
            self._news.set()

    def offer(self, committed: Iterable[events.LoggedEvent]) -> None:
        for event in committed:
            if event.slot > self.cursor:
                self._pending[event.slot] = event
        self._drain()
        if self._pending:
            self._wanted = max(self._wanted, max(self._pending))
            self._news.set()

    def fail(self, exc: BaseException) -> None:
        """The feed is gone: report it once and stop."""
        if self.closed:
            return
        self.close()
        self._on_error(exc)

    def _drain(self) -> None:
        while not self.closed and (event := self._pending.pop(self.cursor + 1, None)):
            self._deliver(event)
        for slot in [s for s in self._pending if s <= self.cursor]:
            del self._pending[slot]

    def _deliver(self, event: events.LoggedEvent) -> None:
        self.cursor = event.slot
        try:
            self._on_event(event)
        except Exception as exc:  # a subscriber's bug must not stop the feed
            log.warning(
                "run %s: feed subscriber failed on slot %d: %s", self.run_id, event.slot, exc
            )
            self._on_error(exc)

    async def _follow(self) -> None:
        try:
            await self._feed.listening()
            while not self.closed:
                await self._news.wait()
                self._news.clear()
                await self._feed.own_writes_returned(self.run_id)
                if self._initial or self._wanted > self.cursor:
                    self._initial = False
                    await self._read_missing()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("run %s: feed failed: %s", self.run_id, exc)
            self.fail(exc)

    async def _read_missing(self) -> None:
        while not self.closed:
            page = await self._feed.list_page(self.run_id, self.cursor)
            for event in page.events:
                if event.slot == self.cursor + 1 and not self.closed:
                    self._deliver(event)
            self._drain()
            if not page.has_more:
                return


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


class Feed:
    """Subscriptions by run, fed by one LISTEN connection."""

    def __init__(self, dsn: str, list_page: ListPage) -> None:
        self._dsn = dsn
        self.list_page = list_page
        self._by_run: dict[str, list[Subscription]] = {}
        # This World's writes in flight per run (each done once it returned and published).
        self._writing: dict[str, set[asyncio.Future[None]]] = {}
        self._listener: asyncio.Task[Any] | None = None
        self._conn: Any = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._closed = False
        self.watchers = changefeed.Watchers()
        self._reconnect: asyncio.Task[None] | None = None
        # Creations come from RUNS_CHANNEL (with their deployment) when the trigger exists.
        self._runs_channel = False

    def subscribe(
        self,
        run_id: str,
        after_slot: int,
        on_event: contract.EventCallback,
        on_error: contract.ErrorCallback,
    ) -> Subscription:
        if self._closed:
            raise errors.StorageUnavailable(f"the live feed of {describe(self._dsn)} is closed")
        sub = Subscription(self, run_id, after_slot, on_event, on_error)
        self._by_run.setdefault(run_id, []).append(sub)
        return sub

    async def watch(
        self, on_change: contract.ChangeCallback, on_resync: contract.ResyncCallback
    ) -> changefeed.Watch:
        """Every run's changes (``contract.Changes.watch``), once the listener is open."""
        if self._closed:
            raise errors.StorageUnavailable(f"the live feed of {describe(self._dsn)} is closed")
        watch = self.watchers.add(on_change, on_resync)
        try:
            await self.listening()
        except BaseException:
            watch.close()
            raise
        return watch

    async def _reconnect_forever(self) -> None:
        """While anyone watches: reopen a lost listener, then tell the watchers to resync."""
        while not self._closed and self.watchers:
            await asyncio.sleep(RECONNECT_SECONDS)
            try:
                await self.listening()
            except errors.WorldError as exc:
                log.warning("the live feed cannot reconnect yet: %s", exc)
                continue
            log.info("the live feed of %s is back: changes watchers resync", describe(self._dsn))
            self.watchers.resync()
            return

    def remove(self, sub: Subscription) -> None:
        subs = self._by_run.get(sub.run_id)
        if subs and sub in subs:
            subs.remove(sub)
            if not subs:
                del self._by_run[sub.run_id]

    @contextlib.contextmanager
    def writing(self, run_id: str) -> Iterator[None]:
        """Around an own write to ``run_id``: its notification waits for it to return."""
        returned = asyncio.get_running_loop().create_future()
        writes = self._writing.setdefault(run_id, set())
        writes.add(returned)
        try:
            yield
        finally:
            returned.set_result(None)
            writes.discard(returned)
            if not writes and self._writing.get(run_id) is writes:
                del self._writing[run_id]

    async def own_writes_returned(self, run_id: str) -> None:
        """Return once the writes of this World to ``run_id`` in flight now have returned."""
        writes = self._writing.get(run_id)
        if writes:
            await asyncio.wait(list(writes))

    def publish(self, run_id: str, committed: list[events.LoggedEvent]) -> None:
        """Offer events this World committed, ahead of their notifications."""
        for sub in list(self._by_run.get(run_id, ())):
            sub.offer(committed)

    @property
    def listener_pid(self) -> int | None:
        """The server process of the LISTEN connection, when one is open."""
        return None if self._conn is None else int(self._conn.get_server_pid())

    async def listening(self) -> None:
        """Return once the LISTEN connection is open (opening it if needed)."""
        if self._listener is None:
            self._listener = asyncio.get_running_loop().create_task(
                self._listen(), name="treadle-pg-listener"
            )
            # Its failure is reported to the subscriptions awaiting it, never left unread.
            self._listener.add_done_callback(_retrieve)
        await asyncio.shield(self._listener)

    async def _listen(self) -> None:
        try:
            conn = await asyncpg.connect(
                self._dsn, server_settings={"application_name": LISTENER_APPLICATION_NAME}
            )
        except DRIVER_ERRORS as exc:
            self._listener = None  # the next subscription tries again
            raise map_error(exc, f"the live feed cannot connect to {describe(self._dsn)}") from exc
        try:
            conn.add_termination_listener(self._on_terminated)
            await conn.add_listener(CHANNEL, self._on_notify)
            self._runs_channel = bool(await conn.fetchval(_HAS_RUNS_TRIGGER))
            if self._runs_channel:
                await conn.add_listener(RUNS_CHANNEL, self._on_run_created)
            if self._closed:
                raise errors.StorageUnavailable("the live feed was closed while it connected")
        except BaseException as exc:
            self._listener = None
            conn.terminate()
            if isinstance(exc, DRIVER_ERRORS):
                where = describe(self._dsn)
                raise map_error(exc, f"the live feed cannot LISTEN on {where}") from exc
            raise
        self._conn = conn
        self._heartbeat = asyncio.get_running_loop().create_task(
            self._check(conn), name="treadle-pg-listener-heartbeat"
        )

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        run_id, _, slot = payload.rpartition(":")
        if not run_id or not slot.isdigit():
            return
        if slot != "1" or not self._runs_channel:
            self.watchers.report(contract.RunChanged(run_id, int(slot)))
        for sub in list(self._by_run.get(run_id, ())):
            sub.notified(int(slot))

    def _on_run_created(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            created = json.loads(payload)
            run_id, deployment_id = str(created["run_id"]), created.get("deployment_id")
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a malformed %s notification", RUNS_CHANNEL)
            return
        deployment = deployment_id if isinstance(deployment_id, str) else None
        self.watchers.report(contract.RunChanged(run_id, 1, deployment))

    def _on_terminated(self, conn: object) -> None:
        if conn is self._conn:
            where = describe(self._dsn)
            self._lost(
                errors.StorageUnavailable(f"the live feed's LISTEN connection to {where} was lost")
            )

    async def _check(self, conn: Any) -> None:
        """Notice a listener connection that died without telling us."""
        while conn is self._conn:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            if conn is not self._conn:
                return
            try:
                await conn.execute("SELECT 1", timeout=HEARTBEAT_TIMEOUT_SECONDS)
            except DRIVER_ERRORS as exc:
                if conn is self._conn:
                    self._lost(map_error(exc, "the live feed's LISTEN connection failed"))
                    conn.terminate()
                return

    def _lost(self, exc: errors.WorldError) -> None:
        log.warning("%s", exc)
        self._conn = None
        self._listener = None
        if self._heartbeat is not None and self._heartbeat is not asyncio.current_task():
            self._heartbeat.cancel()
        self._heartbeat = None
        for subs in list(self._by_run.values()):
            for sub in list(subs):
                sub.fail(exc)
        if (
            self.watchers
            and not self._closed
            and (self._reconnect is None or self._reconnect.done())
        ):
            self._reconnect = asyncio.get_running_loop().create_task(
                self._reconnect_forever(), name="treadle-pg-feed-reconnect"
            )

    async def close(self) -> None:
        self._closed = True
        self.watchers.close()
        reconnect, self._reconnect = self._reconnect, None
        if reconnect is not None:
            reconnect.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reconnect
        for subs in list(self._by_run.values()):
            for sub in list(subs):
                sub.close()
        listener, self._listener = self._listener, None
        if listener is not None and not listener.done():
            listener.cancel()
            with contextlib.suppress(BaseException):
                await listener
        heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is not None:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(*DRIVER_ERRORS):
                await conn.close(timeout=5)
