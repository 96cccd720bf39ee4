"""The world-wide changes feed's plumbing, shared by every World (``contract.Changes``).

A World keeps one ``Watchers`` and tells it what committed: ``committed``
(events a writer of this process just committed), ``report`` (a notification
naming a run and a slot) or ``resync`` (it cannot tell what changed). Each
watch hears it on the event loop soon after (``loop.call_soon``), never inside
the writer's call, and an exception in a watcher's callback is logged, never
passed back to the writer. A run's creation is reported on its own at slot 1
with its deployment; the other events of one commit are coalesced into one
report at the highest slot.

Used by ``worlds.local.feed``, ``worlds.postgres.feed`` and
``testing.memory.feed``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from treadle.world import contract, events

log = logging.getLogger("treadle.world.changefeed")


class Watch:
    """One watcher of every run's changes; ``close()`` stops it."""

    def __init__(
        self,
        watchers: Watchers,
        on_change: contract.ChangeCallback,
        on_resync: contract.ResyncCallback,
    ) -> None:
        self._watchers = watchers
        self._on_change = on_change
        self._on_resync = on_resync
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._watchers.remove(self)

    def _change(self, change: contract.RunChanged) -> None:
        if self.closed:
            return
        try:
            self._on_change(change)
        except Exception as exc:  # a watcher's bug must not stop the feed
            log.warning(
                "run %s: changes watcher failed on slot %d: %s", change.run_id, change.slot, exc
            )

    def _resync(self) -> None:
        if self.closed:
            return
        try:
            self._on_resync()
        except Exception as exc:
            log.warning("changes watcher failed on a resync: %s", exc)


class Watchers:
    """The watches of one World's changes feed."""

    def __init__(self) -> None:
        self._watches: list[Watch] = []

    def __bool__(self) -> bool:
        return bool(self._watches)

    def add(self, on_change: contract.ChangeCallback, on_resync: contract.ResyncCallback) -> Watch:
        watch = Watch(self, on_change, on_resync)
        self._watches.append(watch)
        return watch

    def remove(self, watch: Watch) -> None:
        if watch in self._watches:
            self._watches.remove(watch)

    def report(self, change: contract.RunChanged) -> None:
        """Tell every watch that ``change.run_id`` has events up to ``change.slot``."""
        if not self._watches:
            return
        loop = asyncio.get_running_loop()
        for watch in list(self._watches):
            loop.call_soon(watch._change, change)

    def committed(self, run_id: str, committed: Iterable[events.LoggedEvent]) -> None:
        """Events this process committed to ``run_id``: the creation alone, the rest as one."""
        if not self._watches:
            return
        highest = 0
        for logged in committed:
            if logged.slot == 1 and isinstance(logged.event, events.RunCreated):
                self.report(contract.RunChanged(run_id, 1, logged.event.deployment_id))
            else:
                highest = max(highest, logged.slot)
        if highest:
            self.report(contract.RunChanged(run_id, highest))

    def resync(self) -> None:
        """Changes may have been missed: every watch re-reads what it follows."""
        if not self._watches:
            return
        loop = asyncio.get_running_loop()
        for watch in list(self._watches):
            loop.call_soon(watch._resync)

    def close(self) -> None:
        for watch in list(self._watches):
            watch.close()
