"""The in-memory World's queue state and every state change of a message.

``MessageQueue`` (one per backend, shared by every MemoryWorld over it) holds
the messages and applies the spec 9 queue rules as the local World does
(``treadle.worlds.local.queue``): ``send`` (key dedupe for 24 h, the run gate
decided at the send, coalescing into an in-flight holder), ``claim`` (lapsed
leases back to ready, due messages leased in line order, messages for a held
run coalesced into the holder), ``renew`` (a heartbeat), ``settle`` (what a
handler's answer does), ``abandon`` and ``lapse``.

A message is ready (perhaps delayed) or leased. Time is ``clock.monotonic()``;
every lease has an asyncio timer that lapses it if no heartbeat renewed it, and
the moment a lapse becomes known the delivery's ``lease_lost`` event is set.
Where several ready messages could go first the order is line order (send
order, a handoff first), or a permutation drawn from the backend's ``rng`` that
keeps each run's line in order.

``consumer.MemoryConsumer`` drives it; ``backend.MemoryBackend`` exposes its
simulation controls.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from treadle import clock
from treadle.testing.memory.stats import QueueStats
from treadle.world import constants, contract, ids, liveness, messages, queuerules, routing

log = logging.getLogger("treadle.testing.memory.queue")

_DEDUPE_WINDOW_SECONDS = constants.QUEUE_MIN_STEP_KEY_DEDUPE_WINDOW_MS / 1000
# The shortest timer the queue sets. A due time a float rounding short of "now" (the
# clock and the loop count time from different origins) must still move time on: a
# zero-length timer under a virtual-time loop would spin without advancing it.
MIN_WAIT_SECONDS = 1e-6


def _max_failed_deliveries(tuning: contract.QueueTuning) -> int:
    """How many raising deliveries send a message to the dead letters: the tuning's
    ``max_failed_deliveries`` where the contract has it, else the local World's bound."""
    limit = getattr(tuning, "max_failed_deliveries", None)
    if isinstance(limit, int):
        return limit
    return int(getattr(constants, "MAX_LOCAL_FAILED_DELIVERIES", 256))


class LeaseLost(asyncio.Event):
    """A delivery's ``lease_lost`` event that remembers when it was first set
    (``clock.monotonic()``), so a test can tell what a delivery did after it knew."""

    def __init__(self) -> None:
        super().__init__()
        self.at: float | None = None

    def set(self) -> None:
        if self.at is None:
            self.at = clock.monotonic()
        super().set()

    def known_before(self, now: float) -> bool:
        """Was the lapse told strictly before ``now``?"""
        return self.at is not None and self.at < now


@dataclass(slots=True)
class Lease:
    token: str
    until: float
    world: str
    consumer: str
    lost: LeaseLost
    timer: asyncio.TimerHandle | None = None
    # The identity of the worker holding it (``treadle.world.liveness``).
    worker: str = ""


@dataclass(slots=True)
class _Liveness:
    """One consumer's heartbeat: its leases lapse once it is silent past ``window``."""

    worker: str
    window: float
    last: float
    timer: asyncio.TimerHandle | None = None


@dataclass(slots=True)
class Entry:
    """One message: its row in the queue."""

    message_id: str
    kind: str
    run_id: str
    gate: str | None
    key: str | None
    payload: str
    line: int
    due: float
    delivery_count: int = 0
    handoffs: int = 0
    coalesced: int = 0
    lease: Lease | None = None


@dataclass(frozen=True, slots=True)
class Leased:
    """What one delivery holds: the message as leased, and the lease's token."""

    message_id: str
    kind: str
    run_id: str
    payload: str
    key: str | None
    delivery_count: int
    handoffs: int
    token: str
    lost: LeaseLost = field(compare=False)


@dataclass(frozen=True, slots=True)
class Settled:
    # "done", "rerun" (coalesced count to cover), "stale" (lease lost), "dead".
    status: str
    coalesced: int = 0


@dataclass(frozen=True, slots=True)
class InFlight:
    """A delivery now holding a message (``backend.in_flight()``)."""

    message_id: str
    run_id: str
    kind: str
    world: str
    consumer: str
    delivery_count: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    message_id: str
    kind: str
    run_id: str
    payload: str
    delivery_count: int
    last_error: str


class MessageQueue:
    def __init__(
        self,
        stats: QueueStats,
        rng: random.Random | None,
        run_spec_version: Callable[[str], int | None],
    ) -> None:
        self.stats = stats
        self.rng = rng
        self._spec_version = run_spec_version
        self.ready: dict[str, Entry] = {}
        self.leased: dict[str, Entry] = {}
        self.keys: dict[str, tuple[str, float]] = {}
        self.holders: dict[str, Entry] = {}
        self.dead_letters: list[DeadLetter] = []
        self._back = 0
        self._front = 0
        # A dict, not a set: wakes go out in a fixed order (the simulation replays it).
        self._listeners: dict[asyncio.Event, None] = {}
        # Per consumer (``Lease.consumer``): its worker's heartbeat.
        self._beats: dict[str, _Liveness] = {}

    # -- wakes ---------------------------------------------------------------------------

    def listen(self, event: asyncio.Event) -> None:
        self._listeners[event] = None

    def unlisten(self, event: asyncio.Event) -> None:
        self._listeners.pop(event, None)

    def wake(self) -> None:
        for event in list(self._listeners):
            event.set()

    # -- sends ---------------------------------------------------------------------------

    def send(self, send: messages.Send, payload: str, *, lose: bool = False) -> messages.SendResult:
        message = send.message
        now = clock.monotonic()
        self.stats.bump(message.run_id, "sends")
        if send.key is not None:
            held = self.keys.get(send.key)
            if held is not None and now - held[1] <= _DEDUPE_WINDOW_SECONDS:
                self.stats.bump(message.run_id, "deduplicated")
                return messages.SendResult(message_id=held[0], deduplicated=True)
        message_id = ids.new_message_id()
        if lose:
            self.stats.bump(message.run_id, "lost_sends")
            return messages.SendResult(message_id=message_id)
        if send.key is not None:
            self.keys[send.key] = (message_id, now)
        version = None
        if isinstance(message, messages.OrchestratorMessage) and message.spec_version is None:
            version = self._spec_version(message.run_id)
        gate = routing.gated_run_id(message, version)
        if gate is not None and send.delay_seconds <= 0 and gate in self.holders:
            # Its run's delivery is in flight: the holder re-runs for it before it acks.
            self._coalesce(self.holders[gate])
            return messages.SendResult(message_id=message_id)
        self._back += 1
        entry = Entry(
            message_id, message.kind, message.run_id, gate, send.key, payload, self._back,
            now + send.delay_seconds,
        )  # fmt: skip
        self.ready[message_id] = entry
        self.wake()
        return messages.SendResult(message_id=message_id)

    def _coalesce(self, holder: Entry) -> None:
        holder.coalesced += 1
        self.stats.bump(holder.run_id, "coalesced")

    # -- claims --------------------------------------------------------------------------

    def claim(
        self,
        kinds: Iterable[str],
        capacity: int,
        lease_seconds: float,
        *,
        world: str,
        consumer: str,
        worker: str = "",
    ) -> list[Leased]:
        """Lease what is due (up to ``capacity``), coalescing messages for held runs."""
        now = clock.monotonic()
        for entry in [e for e in self.leased.values() if e.lease and e.lease.until < now]:
            self.lapse(entry)
        wanted = frozenset(kinds)
        due = [e for e in self.ready.values() if e.due <= now and e.kind in wanted]
        claimed: list[Leased] = []
        for entry in self._order(due):
            holder = self.holders.get(entry.gate) if entry.gate is not None else None
            if holder is not None:
                del self.ready[entry.message_id]
                self._coalesce(holder)
                continue
            if capacity <= 0:
                continue
            capacity -= 1
            claimed.append(self._lease(entry, now, lease_seconds, world, consumer, worker))
        return claimed

    def _order(self, due: list[Entry]) -> list[Entry]:
        due.sort(key=lambda e: e.line)
        if self.rng is None or len(due) < 2:
            return due
        # A random order that keeps each run's line (and so a handoff first in it).
        slots = list(range(len(due)))
        self.rng.shuffle(slots)
        by_line: dict[str | None, list[int]] = {}
        for index, entry in enumerate(due):
            by_line.setdefault(entry.gate or entry.message_id, []).append(index)
        order: list[Entry | None] = [None] * len(due)
        for indexes in by_line.values():
            for position, index in zip(sorted(slots[i] for i in indexes), indexes, strict=True):
                order[position] = due[index]
        return [e for e in order if e is not None]

    def _lease(
        self,
        entry: Entry,
        now: float,
        lease_seconds: float,
        world: str,
        consumer: str,
        worker: str = "",
    ) -> Leased:
        del self.ready[entry.message_id]
        self.leased[entry.message_id] = entry
        entry.delivery_count += 1
        entry.coalesced = 0
        lease = Lease(
            clock.token_hex(8), now + lease_seconds, world, consumer, LeaseLost(), worker=worker
        )
        lease.timer = asyncio.get_running_loop().call_later(
            lease_seconds, self._lease_timer, entry, lease
        )
        entry.lease = lease
        if entry.gate is not None:
            self.holders[entry.gate] = entry
        self.stats.bump(entry.run_id, "deliveries")
        return Leased(
            entry.message_id, entry.kind, entry.run_id, entry.payload, entry.key,
            entry.delivery_count, entry.handoffs, lease.token, lease.lost,
        )  # fmt: skip

    def next_due(self, kinds: Iterable[str] | None = None) -> float | None:
        """The earliest due time of a ready message (of ``kinds``); lapses have their timers."""
        wanted = None if kinds is None else frozenset(kinds)
        times = [e.due for e in self.ready.values() if wanted is None or e.kind in wanted]
        return min(times) if times else None

    # -- leases --------------------------------------------------------------------------

    def _current(self, leased: Leased) -> Entry | None:
        """The message's entry if this delivery still holds its lease (lapsing it if due)."""
        entry = self.leased.get(leased.message_id)
        if entry is None or entry.lease is None or entry.lease.token != leased.token:
            return None
        if clock.monotonic() > entry.lease.until:
            self.lapse(entry)
            return None
        return entry

    def _lease_timer(self, entry: Entry, lease: Lease) -> None:
        if entry.lease is not lease:
            return
        left = lease.until - clock.monotonic()
        if left > 0:
            lease.timer = asyncio.get_running_loop().call_later(
                max(left, MIN_WAIT_SECONDS), self._lease_timer, entry, lease
            )
            return
        log.info(
            "message %s (run %s): lease of %s lapsed; delivering it again",
            entry.message_id,
            entry.run_id,
            lease.consumer,
        )
        self.lapse(entry)

    def lapse(self, entry: Entry) -> None:
        """The delivery holding ``entry`` lost its lease: tell it, and make the message due."""
        lease = entry.lease
        if lease is None:
            return
        lease.lost.set()
        self.stats.bump(entry.run_id, "lease_lapses")
        self._ready(entry, clock.monotonic(), counted=True)

    # -- worker liveness (``treadle.world.liveness``) --------------------------------------

    def release_worker(self, worker: str, world: str) -> int:
        """Restart in place: a consumer of ``world`` starts as ``worker``; every lease a
        previous incarnation (another World, so another process) holds under that identity
        lapses now. How many did."""
        mine = [
            e
            for e in self.leased.values()
            if e.lease is not None and e.lease.worker == worker and e.lease.world != world
        ]
        for entry in mine:
            log.info(
                "message %s (run %s): worker %s restarted in place; delivering it again",
                entry.message_id,
                entry.run_id,
                worker,
            )
            self.stats.bump(entry.run_id, "restart_releases")
            self.lapse(entry)
        return len(mine)

    def beat(self, consumer: str, worker: str, window: float) -> None:
        """``consumer``'s heartbeat: its leases stay while it beats within ``window``."""
        now = clock.monotonic()
        live = self._beats.get(consumer)
        if live is None:
            live = self._beats[consumer] = _Liveness(worker, window, now)
        live.last = now
        if live.timer is None:
            live.timer = asyncio.get_running_loop().call_later(
                window, self._liveness_timer, consumer, live
            )

    def forget_worker(self, consumer: str) -> None:
        """A consumer closed: it beats no more, and nothing it held lapses for that."""
        live = self._beats.pop(consumer, None)
        if live is not None and live.timer is not None:
            live.timer.cancel()

    def _liveness_timer(self, consumer: str, live: _Liveness) -> None:
        if self._beats.get(consumer) is not live:
            return
        live.timer = None
        now = clock.monotonic()
        if not liveness.lapsed(live.last, now, live.window):
            live.timer = asyncio.get_running_loop().call_later(
                max(live.last + live.window - now, MIN_WAIT_SECONDS) + MIN_WAIT_SECONDS,
                self._liveness_timer,
                consumer,
                live,
            )
            return
        del self._beats[consumer]
        held = [
            e for e in self.leased.values() if e.lease is not None and e.lease.consumer == consumer
        ]
        for entry in held:
            log.info(
                "message %s (run %s): worker %s silent past its liveness; a survivor takes it over",
                entry.message_id,
                entry.run_id,
                live.worker,
            )
            self.stats.bump(entry.run_id, "takeovers")
            self.lapse(entry)

    def renew(self, leased: Leased, lease_seconds: float) -> bool:
        """Extend a live lease; False once it has lapsed or been taken over."""
        entry = self._current(leased)
        if entry is None or entry.lease is None:
            return False
        entry.lease.until = clock.monotonic() + lease_seconds
        return True

    # -- settlements ---------------------------------------------------------------------

    def settle(
        self,
        leased: Leased,
        outcome: queuerules.Outcome,
        covered: int,
        tuning: contract.QueueTuning,
    ) -> Settled:
        """Apply a handler's answer, if this delivery still holds its lease."""
        entry = self._current(leased)
        if entry is None:
            return Settled("stale")
        now = clock.monotonic()
        match outcome:
            case messages.Ack():
                if entry.coalesced > covered:
                    self.stats.bump(entry.run_id, "reruns")
                    return Settled("rerun", coalesced=entry.coalesced)
                self._release(entry)
                del self.leased[entry.message_id]
                self.wake()
            case messages.Redeliver(seconds=seconds):
                delay = queuerules.clamp_redeliver_delay(seconds)
                self._ready(entry, now + delay, counted=True)
            case messages.Handoff():
                if entry.handoffs >= constants.MAX_LOCAL_HANDOFFS:
                    self._ready(entry, now, counted=True)  # past the bound: a counted reschedule
                else:
                    entry.handoffs += 1
                    self._front -= 1
                    entry.line = self._front
                    self.stats.bump(entry.run_id, "handoffs")
                    self._ready(entry, now, counted=False)
            case queuerules.Failed(error=error):
                failures = entry.delivery_count - entry.handoffs
                if failures >= _max_failed_deliveries(tuning):
                    self._dead_letter(entry, error)
                    return Settled("dead")
                self._ready(entry, now + tuning.backoff_seconds(failures), counted=True)
        return Settled("done")

    def refuse(self, leased: Leased, error: str) -> None:
        """A delivery refused at the boundary (``queuerules.admit``): a dead letter at once."""
        entry = self._current(leased)
        if entry is not None:
            self._dead_letter(entry, error)

    def abandon(self, leased: Leased) -> None:
        """A delivery cut off by shutdown: due again at once, counted above 1."""
        entry = self._current(leased)
        if entry is not None:
            self._ready(entry, clock.monotonic(), counted=True)

    def _release(self, entry: Entry) -> None:
        lease, entry.lease = entry.lease, None
        if lease is not None and lease.timer is not None:
            lease.timer.cancel()
        if entry.gate is not None and self.holders.get(entry.gate) is entry:
            del self.holders[entry.gate]
        entry.coalesced = 0

    def _ready(self, entry: Entry, due: float, *, counted: bool) -> None:
        self._release(entry)
        self.leased.pop(entry.message_id, None)
        entry.due = due
        self.ready[entry.message_id] = entry
        if counted:
            self.stats.bump(entry.run_id, "redeliveries")
        self.wake()

    def _dead_letter(self, entry: Entry, error: str) -> None:
        self._release(entry)
        self.leased.pop(entry.message_id, None)
        self.dead_letters.append(
            DeadLetter(
                entry.message_id,
                entry.kind,
                entry.run_id,
                entry.payload,
                entry.delivery_count,
                error,
            )
        )
        self.stats.bump(entry.run_id, "dead_letters")
        self.wake()

    # -- views ---------------------------------------------------------------------------

    def in_flight(self) -> list[InFlight]:
        return [
            InFlight(
                e.message_id, e.run_id, e.kind, e.lease.world, e.lease.consumer, e.delivery_count
            )
            for e in self.leased.values()
            if e.lease is not None
        ]

    def queued(self) -> int:
        return len(self.ready) + len(self.leased)

    def backlog(self, kind: str, deployment_id: str) -> int:
        """Due ``kind`` messages for ``deployment_id``: ready and due, or in flight."""
        now = clock.monotonic()
        waiting = [e for e in self.ready.values() if e.due <= now]
        return sum(
            1
            for e in [*waiting, *self.leased.values()]
            if e.kind == kind and queuerules.payload_deployment(e.payload) == deployment_id
        )
