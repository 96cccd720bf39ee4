"""Worker liveness on NATS: one KV entry per worker, restart in place, survivor takeover.

The rules are ``treadle.world.liveness``'s. Each consuming ``NatsQueue`` is one
worker with one entry (``names.Names.worker_key``) in the stream's worker bucket
(``<stream>_WORKERS``), holding ``Beat`` as JSON: its identity, its incarnation
(random per process), its liveness window and the deliveries it holds (each
one's ack reply subject and, for a gated delivery, its run lease and token).

- **Beats.** Every ``liveness.beat_interval`` (a second) the worker rewrites its
  entry, a compare-and-set on the revision it last wrote: one KV update per
  worker per second, whatever it holds, never one per delivery; a delivery taken
  is listed sooner (``HELD_CHANGE_DELAY_SECONDS`` after the last write, one
  write for a burst), so a worker killed a moment after taking a message has it
  released too. A write that finds another revision
  means its entry was claimed (a survivor took it over, or a process with the
  same identity started): every delivery it holds is lost. A worker whose
  beats fail for ``liveness - self_margin`` treats its deliveries as lost too.
  Either way ``DeliveryLease.is_set()`` is true at once for them (no await
  between the check and the answer), so the handler stops and writes nothing.
- **Restart in place.** At start, a worker with a configured identity reads its
  entry: a previous incarnation's held deliveries are released (each run lease
  by its token, then a NAK to each reply subject; an ack or a NAK is a publish
  to the message's reply subject, which any connection may send), so JetStream
  delivers them again at once.
- **Survivor takeover.** Every worker watches its deployment's entries in the
  bucket (one KV watch: the workers that serve the same consumers); an
  entry that has not changed for its own liveness window (by the watcher's
  clock: no clock skew) is claimed with a revision-checked update, so of two
  survivors one acts; the claimer releases what it held, then deletes it.

A delivery taken less than ``HELD_CHANGE_DELAY_SECONDS`` before the worker died
(or before its last write failed) is not listed: it comes back when its
JetStream lease (AckWait) lapses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from treadle import clock
from treadle.world import liveness
from treadle.worlds.nats import leases, names
from treadle.worlds.nats.delivery import Delivery

log = logging.getLogger("treadle.worlds.nats.liveness")

# An entry not rewritten for this long belongs to no live worker; the bucket drops it.
WORKER_BUCKET_TTL_SECONDS: Final = 3600.0
_NAK: Final = b"-NAK"
_STREAM_NAME_EXISTS: Final = 10058
_MAX_HELD_LISTED: Final = 10_000
# A delivery taken is listed this soon (not at the next beat): a worker killed a moment
# after it took a message still has it released at once. Beats stay once a second.
HELD_CHANGE_DELAY_SECONDS: Final = 0.1


@dataclass(frozen=True, slots=True)
class Held:
    """One delivery as its worker's entry lists it."""

    reply: str
    lease_key: str | None = None
    token: str | None = None
    # The message id that takes the run lease (a gated delivery): listed from the
    # first beat, so a worker killed before its token was listed (the first
    # ``HELD_CHANGE_DELAY_SECONDS`` of a delivery) still has that lease released.
    holder: str | None = None


@dataclass(frozen=True, slots=True)
class Beat:
    """A worker's entry: who, which incarnation, its window, what it holds."""

    worker: str
    incarnation: str
    liveness_ms: int
    held: tuple[Held, ...] = ()
    # "live", or "taken" once a survivor (or the next incarnation) claimed it.
    state: str = "live"
    # When it was written (the writer's wall clock, ms); 0 when unknown.
    beat_ms: int = 0

    def encode(self) -> bytes:
        return json.dumps(
            {
                "worker": self.worker,
                "incarnation": self.incarnation,
                "liveness_ms": self.liveness_ms,
                "state": self.state,
                "beat_ms": clock.now_ms(),
                "held": [[h.reply, h.lease_key, h.token, h.holder] for h in self.held],
            }
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> Beat | None:
        try:
            raw = json.loads(data)
            held = tuple(_held(item) for item in raw.get("held", [])[:_MAX_HELD_LISTED])
            return cls(
                worker=str(raw["worker"]),
                incarnation=str(raw["incarnation"]),
                liveness_ms=max(1, int(raw["liveness_ms"])),
                held=held,
                state=str(raw.get("state", "live")),
                beat_ms=int(raw.get("beat_ms", 0)),
            )
        except (ValueError, KeyError, TypeError):
            return None


def _held(item: list[object]) -> Held:
    """One listed delivery: ``[reply, lease_key, token]``, or with its holder too."""
    reply, key, token, *rest = item
    holder = rest[0] if rest else None
    return Held(
        str(reply),
        None if key is None else str(key),
        None if token is None else str(token),
        None if holder is None else str(holder),
    )


@dataclass(slots=True)
class _Seen:
    """What a survivor knows of another worker's entry."""

    revision: int
    at: float  # monotonic, when this revision was seen
    beat: Beat | None


async def ensure_worker_bucket(
    js: JetStreamContext, ns: names.Names, *, replicas: int = 1
) -> KeyValue:
    """Create or bind the KV bucket of worker heartbeats."""
    try:
        return await js.create_key_value(
            bucket=ns.worker_bucket,
            history=1,
            ttl=WORKER_BUCKET_TTL_SECONDS,
            storage=api.StorageType.FILE,
            replicas=replicas,
        )
    except nats.js.errors.APIError as exc:
        if exc.err_code != _STREAM_NAME_EXISTS:
            raise
        return await js.key_value(ns.worker_bucket)


def _is_conflict(exc: BaseException) -> bool:
    return leases._is_conflict(exc)


class WorkerLiveness:
    """One worker's entry, beats and watch (see the module docstring)."""

    def __init__(
        self,
        nc: Client,
        kv: KeyValue,
        ns: names.Names,
        run_leases: leases.RunLeases,
        *,
        worker_id: str | None,
        liveness_seconds: float,
        lease_seconds: float,
    ) -> None:
        self._nc = nc
        self._kv = kv
        self._ns = ns
        self._leases = run_leases
        self.worker_id, self.stable = liveness.worker_id(worker_id)
        self.key = ns.worker_key(self.worker_id)
        self.liveness_seconds = liveness_seconds
        self._lease_seconds = lease_seconds
        self._interval = liveness.beat_interval(liveness_seconds)
        self.beat_seconds = self._interval
        self._incarnation = clock.token_hex(8)
        self._revision = 0
        # When the last beat that was written had been sent (monotonic).
        self._beat_sent = time.monotonic()
        self._held: dict[int, Delivery] = {}
        self._added = asyncio.Event()
        self._written_at = 0.0
        self._seen: dict[str, _Seen] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._watcher: Any = None
        self.released_at_start = 0
        self.taken_over = 0
        self._closed = False
        # Deliveries given up while this worker's own beats failed (``_lose_all``), and
        # when its last good beat before that was sent.
        self._orphans: list[Held] = []
        self._orphaned_at = 0.0

    # -- the worker's own entry -----------------------------------------------------------

    def fresh(self) -> bool:
        """This worker still holds its deliveries (its beats are getting through)."""
        return liveness.holder_fresh(self._beat_sent, time.monotonic(), self.liveness_seconds)

    def expired(self) -> Callable[[], bool]:
        """For a ``DeliveryLease``: true once this worker's deliveries are lost."""
        return lambda: not self.fresh()

    def hold(self, d: Delivery) -> None:
        self._held[d.sequence] = d
        self._added.set()

    def drop(self, d: Delivery) -> None:
        if self._held.get(d.sequence) is d:
            del self._held[d.sequence]

    def _beat(self) -> Beat:
        held = tuple(
            Held(d.msg.reply, d.gate_key, d.token, d.message_id if d.gate_key else None)
            for d in self._held.values()
            if d.msg.reply and not d.lease_lost.is_set()
        )
        return Beat(self.worker_id, self._incarnation, round(self.liveness_seconds * 1000), held)

    async def start(self) -> None:
        """Take this worker's entry (releasing a previous incarnation's deliveries when the
        identity is stable), then beat and watch."""
        for _ in range(16):
            previous, revision = await self._read(self.key)
            sent = time.monotonic()
            try:
                self._revision = await self._kv.update(self.key, self._beat().encode(), revision)
            except nats.js.errors.APIError as exc:
                if _is_conflict(exc):
                    continue  # a survivor claimed it meanwhile: read again
                raise
            self._beat_sent = sent
            if previous is not None and previous.state == "live" and self.stable:
                self.released_at_start = len(previous.held)
                log.warning(
                    "worker %s: restarted in place; releasing the %d deliveries its previous "
                    "incarnation held",
                    self.worker_id,
                    len(previous.held),
                )
                age = max(0.0, (clock.now_ms() - previous.beat_ms) / 1000)
                await self._release(previous.held, age)
            break
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._beating(), name="treadle-nats-beat"))
        self._watcher = await self._kv.watch(f"{names.token(self._ns.deployment)}.*")
        self._tasks.append(loop.create_task(self._watching(), name="treadle-nats-watch"))
        self._tasks.append(loop.create_task(self._checking(), name="treadle-nats-takeover"))

    async def close(self) -> None:
        """Stop beating and watching; remove this worker's entry (it holds nothing now)."""
        self._closed = True  # a loop whose cancellation a client call swallowed ends too
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2.0)
        self._tasks.clear()
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await self._watcher.stop()
        if self._revision and not self._held:
            with contextlib.suppress(Exception):
                await self._kv.delete(self.key, last=self._revision)

    async def _beating(self) -> None:
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._added.wait()
                # A delivery was taken: list it soon, HELD_CHANGE_DELAY_SECONDS after the
                # last write at most (a burst of deliveries is one write).
                gap = self._written_at + HELD_CHANGE_DELAY_SECONDS - time.monotonic()
                if gap > 0:
                    await asyncio.sleep(gap)
            self._added.clear()
            sent = self._written_at = time.monotonic()
            try:
                async with asyncio.timeout(max(self._interval, 0.2)):
                    self._revision = await self._kv.update(
                        self.key, self._beat().encode(), last=self._revision
                    )
                self._beat_sent = sent
                if self._orphans:
                    await self._release_orphans()
            except nats.js.errors.APIError as exc:
                if not _is_conflict(exc):
                    log.warning("worker %s: heartbeat failed: %s", self.worker_id, exc)
                else:
                    self._claimed_under_us()
                    await self._retake()
            except (TimeoutError, nats.errors.Error, OSError) as exc:
                log.warning("worker %s: heartbeat failed: %s", self.worker_id, exc)
            if not self.fresh():
                self._lose_all(
                    f"its heartbeat could not be written for {self.liveness_seconds:g} s",
                    orphaned=True,
                )

    def _claimed_under_us(self) -> None:
        log.warning(
            "worker %s: its heartbeat entry was claimed by another process (a survivor took "
            "it over after a liveness lapse, or another worker has the same TREADLE_WORKER_ID)",
            self.worker_id,
        )
        self._lose_all("its heartbeat entry was taken over")

    def _lose_all(self, why: str, *, orphaned: bool = False) -> None:
        """Every delivery held is lost: the handlers stop, nothing more is written.

        ``orphaned``: lost because this worker's own beats failed (NATS unreachable, a
        stalled loop), not because its entry was claimed. If the next beat finds the
        entry still its own, no survivor released them: this worker releases them itself
        then (``_release_orphans``), so they come back at once, not at their lease."""
        if orphaned:
            self._orphans.extend(
                Held(d.msg.reply, d.gate_key, d.token) for d in self._held.values() if d.msg.reply
            )
            self._orphaned_at = self._orphaned_at or self._beat_sent
        else:
            self._orphans.clear()  # the claimer releases them
        if not self._held:
            return
        log.warning(
            "worker %s: %s; its %d deliveries are lost (their answers are dropped)",
            self.worker_id,
            why,
            len(self._held),
        )
        for d in self._held.values():
            d.lease_lost.set()
        self._held.clear()

    async def _release_orphans(self) -> None:
        """The beat got through with this worker's own revision: nobody claimed its entry,
        so nobody released what it lost meanwhile. Release it now."""
        orphans, self._orphans = tuple(self._orphans), []
        age = time.monotonic() - self._orphaned_at
        self._orphaned_at = 0.0
        log.warning(
            "worker %s: its heartbeat is back and its entry still its own; releasing the %d "
            "deliveries it gave up",
            self.worker_id,
            len(orphans),
        )
        await self._release(orphans, age)

    async def _retake(self) -> None:
        """After a claim: a new incarnation's entry, so new deliveries are covered."""
        self._incarnation = clock.token_hex(8)
        _, revision = await self._read(self.key)
        sent = time.monotonic()
        with contextlib.suppress(nats.js.errors.APIError):
            self._revision = await self._kv.update(self.key, self._beat().encode(), revision)
            self._beat_sent = sent

    # -- survivors ------------------------------------------------------------------------

    async def _watching(self) -> None:
        async for entry in self._watcher:
            if entry is None or entry.key == self.key:
                continue
            if entry.operation in ("DEL", "PURGE"):
                self._seen.pop(entry.key, None)
                continue
            beat = Beat.decode(entry.value or b"")
            self._seen[entry.key] = _Seen(int(entry.revision or 0), time.monotonic(), beat)

    async def _checking(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._interval / 2)
            if not self.fresh():
                continue  # a worker that is itself lapsed takes nothing over
            now = time.monotonic()
            for key, seen in list(self._seen.items()):
                beat = seen.beat
                window = self.liveness_seconds if beat is None else beat.liveness_ms / 1000
                if (beat is None or beat.state == "live") and liveness.lapsed(seen.at, now, window):
                    try:
                        await self._take_over(key, seen)
                    except Exception as exc:
                        log.warning("worker takeover of %s failed: %s", key, exc)

    async def _take_over(self, key: str, seen: _Seen) -> None:
        beat = seen.beat
        who = beat.worker if beat is not None else key
        claim = Beat(
            who, beat.incarnation if beat else "", beat.liveness_ms if beat else 0, (), "taken"
        )
        try:
            revision = await self._kv.update(key, claim.encode(), last=seen.revision)
        except nats.js.errors.APIError as exc:
            if _is_conflict(exc):
                self._seen.pop(key, None)  # it beat again, or another survivor claimed it
                return
            raise
        self._seen.pop(key, None)
        self.taken_over += 1
        held = beat.held if beat is not None else ()
        log.warning(
            "worker %s: no heartbeat for %.1f s; worker %s takes over its %d deliveries",
            who,
            time.monotonic() - seen.at,
            self.worker_id,
            len(held),
        )
        await self._release(held, time.monotonic() - seen.at)
        with contextlib.suppress(Exception):
            await self._kv.delete(key, last=revision)

    # -- shared ---------------------------------------------------------------------------

    async def _read(self, key: str) -> tuple[Beat | None, int]:
        try:
            entry = await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError as exc:
            marker = exc.entry
            return None, int(marker.revision) if marker is not None else 0
        return Beat.decode(entry.value or b""), int(entry.revision or 0)

    async def _release(self, held: tuple[Held, ...], age: float) -> None:
        """Let each held run lease go (by its token), then NAK each delivery: JetStream
        delivers them again at once.

        JetStream takes a NAK by stream sequence, whatever delivery it names: once the
        dead worker's JetStream lease may have lapsed (``age`` seconds since its last
        beat, the lease less the third between two progress acks), its message may be
        another worker's delivery now, which a NAK would deliver a second time. Then
        nothing is sent: the lease has done the work already.
        """
        if age > self._lease_seconds * 2 / 3 - self.liveness_seconds * 0.2:
            log.info(
                "worker %s: its last beat is %.1f s old, past what its deliveries' lease "
                "leaves; they are delivered again by the lease, not released",
                self.worker_id,
                age,
            )
            return
        for h in held:
            try:
                if h.lease_key is not None and h.token is not None:
                    await self._leases.release(h.lease_key, h.token)
                elif h.lease_key is not None and h.holder is not None:
                    # Listed before its token was: the lease, if that message took it, is
                    # the dead delivery's (only our NAK below delivers the message again
                    # within ``age``), so it goes by its holder.
                    await self._leases.release_holder(h.lease_key, h.holder)
            except Exception as exc:
                log.warning("run lease %s: release failed: %s", h.lease_key, exc)
            if not h.reply.startswith(f"$JS.ACK.{self._ns.stream}."):
                continue  # not one of this stream's acks: an entry never sends elsewhere
            try:
                await self._nc.publish(h.reply, _NAK)
            except Exception as exc:
                log.warning("nak of %s failed: %s", h.reply, exc)
        with contextlib.suppress(Exception):
            await self._nc.flush()
