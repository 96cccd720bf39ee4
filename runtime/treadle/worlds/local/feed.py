"""The local live feed: pushes a run's committed events to subscribers in slot order.

Writers in this process hand every committed event to ``Feed.publish`` right
after the commit. Another process's writes are noticed by one watcher per feed,
which asks the database every half second whether another connection committed
(``PRAGMA data_version``, one cheap call however many runs are followed) and
only then has every subscription read its tail.
A subscription delivers contiguous slots at once; on a gap (an event it has not
been handed, or events committed before it subscribed) it reads the missing
slots from the log. Callbacks run on the event loop; an exception in one is
passed to the subscriber's ``on_error`` and delivery goes on.

The world-wide changes feed (``watch``, ``contract.Changes``) hears every
commit of this process's writers as they publish it (no read), and a resync
whenever the watcher sees that another process committed (it cannot tell what).

Called by ``storage.LocalEvents``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from treadle.world import changefeed, contract, events, records

log = logging.getLogger("treadle.worlds.local.feed")

EXTERNAL_WRITE_POLL_SECONDS = 0.5

ListPage = Callable[[str, int], Awaitable[records.EventPage]]
# True when another connection committed since the last call.
ExternalWrites = Callable[[], Awaitable[bool]]


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
        self._gap = asyncio.Event()
        self._gap.set()  # read what was committed before we subscribed
        self._closed = False
        self._task = asyncio.get_running_loop().create_task(
            self._fill_gaps(), name=f"treadle-feed-{run_id}"
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._feed.remove(self)
        self._task.cancel()

    def offer(self, committed: Iterable[events.LoggedEvent]) -> None:
        for event in committed:
            if event.slot > self.cursor:
                self._pending[event.slot] = event
        self._drain()
        if self._pending:
            self._gap.set()

    def _drain(self) -> None:
        while not self._closed and (event := self._pending.pop(self.cursor + 1, None)):
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

    def external_writes(self) -> None:
        """Another process committed: read the tail."""
        self._gap.set()

    async def _fill_gaps(self) -> None:
        while not self._closed:
            await self._gap.wait()
            self._gap.clear()
            try:
                while not self._closed:
                    page = await self._feed.list_page(self.run_id, self.cursor)
                    for event in page.events:
                        if event.slot == self.cursor + 1:
                            self._deliver(event)
                    self._drain()
                    if not page.has_more:
                        break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("run %s: feed read failed: %s", self.run_id, exc)
                self._on_error(exc)
                self.close()
                return


class Feed:
    """Subscriptions by run."""

    def __init__(self, list_page: ListPage, external_writes: ExternalWrites) -> None:
        self.list_page = list_page
        self._external_writes = external_writes
        self._by_run: dict[str, list[Subscription]] = {}
        self._watcher: asyncio.Task[None] | None = None
        self.watchers = changefeed.Watchers()

    def subscribe(
        self,
        run_id: str,
        after_slot: int,
        on_event: contract.EventCallback,
        on_error: contract.ErrorCallback,
    ) -> Subscription:
        sub = Subscription(self, run_id, after_slot, on_event, on_error)
        self._by_run.setdefault(run_id, []).append(sub)
        self._start_watcher()
        return sub

    async def watch(
        self, on_change: contract.ChangeCallback, on_resync: contract.ResyncCallback
    ) -> changefeed.Watch:
        """Every run's changes (``contract.Changes.watch``)."""
        watch = self.watchers.add(on_change, on_resync)
        self._start_watcher()
        return watch

    def _start_watcher(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(
                self._watch(), name="treadle-feed-watcher"
            )

    def remove(self, sub: Subscription) -> None:
        subs = self._by_run.get(sub.run_id)
        if subs and sub in subs:
            subs.remove(sub)
            if not subs:
                del self._by_run[sub.run_id]

    def publish(self, run_id: str, committed: list[events.LoggedEvent]) -> None:
        for sub in list(self._by_run.get(run_id, ())):
            sub.offer(committed)
        self.watchers.committed(run_id, committed)

    async def _watch(self) -> None:
        """While anyone subscribes: every half second, did another process commit?"""
        while self._by_run or self.watchers:
            await asyncio.sleep(EXTERNAL_WRITE_POLL_SECONDS)
            try:
                changed = await self._external_writes()
            except Exception as exc:
                log.warning("cannot tell whether another process wrote: %s", exc)
                changed = True  # read the tails; their failures reach the subscribers
            if changed:
                self.watchers.resync()
                for subs in list(self._by_run.values()):
                    for sub in list(subs):
                        sub.external_writes()

    def close(self) -> None:
        self.watchers.close()
        for subs in list(self._by_run.values()):
            for sub in list(subs):
                sub.close()
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
