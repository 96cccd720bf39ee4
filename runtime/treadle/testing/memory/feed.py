"""The in-memory World's live feed: pushes a run's committed events in slot order.

A ``Subscription`` keeps a cursor into its run's log. Every commit to the run
schedules (``loop.call_soon``) a pump that hands the subscriber each event past
the cursor, read from the log itself, so what it gets is always dense and in
slot order, backlog first. Callbacks run on the event loop; an exception in one
is passed to the subscriber's ``on_error`` and delivery goes on.

``Feeds.drop`` is the simulation's "the live feed dropped": every subscription
(of a run) hears ``on_error(ConnectionError)`` and is closed, as a real feed
whose connection broke; every watch of the world-wide changes feed
(``MemoryChanges.watch``) hears ``on_resync()``, as a real feed that reconnected.
Every commit is also reported to those watches (``treadle.world.changefeed``),
read from the log's head at commit time.

Owned by ``backend.MemoryBackend``; ``storage.MemoryEvents.subscribe`` opens
subscriptions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from treadle.world import changefeed, contract, events

log = logging.getLogger("treadle.testing.memory.feed")

ReadAfter = Callable[[str, int], list[events.LoggedEvent]]
# A run's head: its highest slot and its deployment.
Head = Callable[[str], tuple[int, str]]


class Subscription:
    """One subscriber of one run; ``close()`` stops it."""

    def __init__(
        self,
        feeds: Feeds,
        run_id: str,
        after_slot: int,
        on_event: contract.EventCallback,
        on_error: contract.ErrorCallback,
    ) -> None:
        self._feeds = feeds
        self.run_id = run_id
        self.cursor = after_slot
        self._on_event = on_event
        self._on_error = on_error
        self._scheduled = False
        self.closed = False
        self.schedule()  # what was committed before we subscribed

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._feeds.remove(self)

    def schedule(self) -> None:
        if not self._scheduled and not self.closed:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def fail(self, exc: BaseException) -> None:
        """The feed broke under this subscription: tell it, then close."""
        if self.closed:
            return
        self.close()
        self._on_error(exc)

    def _pump(self) -> None:
        self._scheduled = False
        if self.closed:
            return
        try:
            tail = self._feeds.read_after(self.run_id, self.cursor)
        except Exception as exc:  # the run is gone: nothing more will come
            self.fail(exc)
            return
        for event in tail:
            if self.closed:
                return
            self.cursor = event.slot
            try:
                self._on_event(event)
            except Exception as exc:  # a subscriber's bug must not stop the feed
                log.warning(
                    "run %s: feed subscriber failed on slot %d: %s", self.run_id, event.slot, exc
                )
                self._on_error(exc)


class Feeds:
    """Subscriptions by run, for one backend (every MemoryWorld over it)."""

    def __init__(self, read_after: ReadAfter, head: Head) -> None:
        self.read_after = read_after
        self._head = head
        self._by_run: dict[str, list[Subscription]] = {}
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
        return sub

    def remove(self, sub: Subscription) -> None:
        subs = self._by_run.get(sub.run_id)
        if subs and sub in subs:
            subs.remove(sub)
            if not subs:
                del self._by_run[sub.run_id]

    def publish(self, run_id: str) -> None:
        """The run's log grew: every subscriber of it reads its tail soon."""
        for sub in list(self._by_run.get(run_id, ())):
            sub.schedule()
        if self.watchers:
            slot, deployment_id = self._head(run_id)
            created = deployment_id if slot == 1 else None
            self.watchers.report(contract.RunChanged(run_id, slot, created))

    def subscriptions(self, run_id: str | None = None) -> list[Subscription]:
        if run_id is not None:
            return list(self._by_run.get(run_id, ()))
        return [sub for subs in self._by_run.values() for sub in subs]

    def drop(self, run_id: str | None = None) -> int:
        """Break every live subscription (of ``run_id``); returns how many were dropped."""
        dropped = self.subscriptions(run_id)
        for sub in dropped:
            sub.fail(ConnectionError(f"memory World: the live feed of run {sub.run_id} dropped"))
        self.watchers.resync()
        return len(dropped)


class MemoryChanges:
    """One MemoryWorld's world-wide changes feed (``contract.Changes``)."""

    def __init__(self, feeds: Feeds) -> None:
        self._feeds = feeds
        self.watches: list[changefeed.Watch] = []

    async def watch(
        self, on_change: contract.ChangeCallback, on_resync: contract.ResyncCallback
    ) -> changefeed.Watch:
        watch = self._feeds.watchers.add(on_change, on_resync)
        self.watches = [w for w in self.watches if not w.closed] + [watch]
        return watch

    def close(self) -> None:
        for watch in self.watches:
            watch.close()
        self.watches.clear()
