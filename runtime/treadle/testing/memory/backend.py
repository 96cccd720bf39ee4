"""``MemoryBackend``: the whole shared state of one in-memory World, and the
simulation's controls over it.

It holds the runs and their logs (``log.Store``), the deployments, the queue
(``queue.MessageQueue``) and the live feeds (``feed.Feeds``). It runs on the
current asyncio loop: no threads, no real I/O, every time read through
``treadle.clock`` and every delay, lease and backoff an asyncio timer, so under
a virtual-time loop they all pass at once. Ids come from ``treadle.world.ids``
(random bits from ``treadle.clock``); where the queue has a choice of which
ready message goes first it draws from ``rng`` (default: line order).

Processes reach it through ``world.MemoryWorld`` objects (one per process).
The plain methods below are for the simulation and for tests: they act at
once, need no await, and go through no interceptor.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from treadle.testing.memory.feed import Feeds
from treadle.testing.memory.limits import LimitTables
from treadle.testing.memory.log import Store
from treadle.testing.memory.queue import DeadLetter, InFlight, MessageQueue
from treadle.testing.memory.stats import QueueStats
from treadle.world import contract, events, records


@dataclass
class KeyedSend:
    """One keyed send: which World (process) made it, for which run, and whether the call
    that carried it returned (``ok``; False while it runs and when it raised, so the
    sender rightly takes it as unsent)."""

    world: str
    run_id: str
    key: str
    ok: bool = False


class MemoryBackend:
    """The shared state of one in-memory World (see the module docstring)."""

    def __init__(
        self,
        *,
        tuning: contract.QueueTuning | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.tuning = tuning or contract.QueueTuning()
        self.rng = rng
        self.store = Store()
        self.deployments: dict[str, records.DeploymentRecord] = {}
        self.heartbeats: dict[tuple[str, str], records.HeartbeatRecord] = {}  # step heartbeats
        # Deployments.promote's order: the newest promoted non-retired one is latest.
        self.promoted: dict[str, int] = {}
        self.stats = QueueStats()
        self.queue = MessageQueue(self.stats, rng, self._run_spec_version)
        self.feeds = Feeds(self._read_after, self._head)
        self.schedules: dict[str, records.ScheduleRecord] = {}  # issue 17 item 3
        # Every schedule write, in order: ("put" | "update", the record before or None, after).
        self.schedule_writes: list[
            tuple[str, records.ScheduleRecord | None, records.ScheduleRecord]
        ] = []
        self.limits = LimitTables()  # concurrency and rate limits (issue 17 item 4)
        # Every keyed send, in order, by the World (process) that made it: the simulation's
        # ``near_due_resent`` check reads it (``KeyedSend``).
        self.keyed_sends: list[KeyedSend] = []

    def _run_spec_version(self, run_id: str) -> int | None:
        state = self.store.runs.get(run_id)
        return None if state is None else state.record.spec_version

    def _head(self, run_id: str) -> tuple[int, str]:
        state = self.store.run(run_id)
        return len(state.log), state.record.deployment_id

    def _read_after(self, run_id: str, after_slot: int) -> list[events.LoggedEvent]:
        return [s.read() for s in self.store.run(run_id).log[after_slot:]]

    # -- reads for invariant checks --------------------------------------------------------

    def run_ids(self) -> list[str]:
        """Every run's id, in creation order."""
        return list(self.store.runs)

    def run_record(self, run_id: str) -> records.RunRecord:
        """The run's row as it is now (``RunNotFound`` for an unknown run)."""
        return self.store.run(run_id).record

    def events_of(self, run_id: str) -> list[events.LoggedEvent]:
        """The run's whole log, in slot order (``RunNotFound`` for an unknown run)."""
        return [s.logged for s in self.store.run(run_id).log]

    # -- the queue -------------------------------------------------------------------------

    def in_flight(self) -> list[InFlight]:
        """Every delivery holding a message now: message id, run id, kind, World, consumer."""
        return self.queue.in_flight()

    def queued(self) -> int:
        """Messages not yet acknowledged (ready, delayed and in flight)."""
        return self.queue.queued()

    def next_due(self) -> float | None:
        """The earliest due time (``clock.monotonic()`` seconds) of a message waiting to be
        delivered, delayed or not; None when none waits."""
        return self.queue.next_due()

    def dead_letters(self) -> list[DeadLetter]:
        """Messages whose handler failed ``MAX_LOCAL_FAILED_DELIVERIES`` times."""
        return list(self.queue.dead_letters)

    # -- faults ----------------------------------------------------------------------------

    def force_lease_lapse(self, message_id: str) -> bool:
        """The delivery now holding ``message_id`` loses its lease at once.

        Its ``lease_lost`` event is set, the message is due again (its next delivery
        counted) and the old delivery's later settle is ignored: a duplicate delivery,
        or a clock skew. False when no delivery holds the message.
        """
        entry = self.queue.leased.get(message_id)
        if entry is None or entry.lease is None:
            return False
        self.queue.lapse(entry)
        return True

    def drop_feeds(self, run_id: str | None = None) -> int:
        """Every live subscription (of ``run_id``) hears ``on_error(ConnectionError)`` and
        is closed, as when a feed's connection breaks. Returns how many were dropped."""
        return self.feeds.drop(run_id)

    def lose_message(self, message_id: str) -> bool:
        """The queue loses ``message_id`` (ready, delayed or in flight): no delivery of it
        ever comes again, and a delivery holding it settles nothing (seed 000: a redrive
        policy dead-letters it, retention expires it, an operator purges it). False when
        the queue holds no such message."""
        queue = self.queue
        entry = queue.leased.get(message_id) or queue.ready.get(message_id)
        if entry is None:
            return False
        queue._release(entry)
        queue.leased.pop(message_id, None)
        queue.ready.pop(message_id, None)
        self.stats.bump(entry.run_id, "lost_sends")
        queue.wake()
        return True

    def messages_of(self, run_id: str) -> list[str]:
        """The ids of ``run_id``'s messages the queue still holds (ready, delayed, in flight)."""
        queue = self.queue
        return [m for m, e in [*queue.ready.items(), *queue.leased.items()] if e.run_id == run_id]
