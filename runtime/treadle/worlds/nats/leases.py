"""Run leases in JetStream KV: one orchestrator delivery per run across every worker.

A gated message (``routing.gated_run_id``) must hold its run's lease before its
handler runs. The lease is one KV entry per run (``names.Names.lease_key``)
holding ``Lease`` as JSON; every write is a compare-and-set on the entry's
revision, so concurrent workers agree on one outcome:

- ``take``: a free, expired or reserved-for-us lease is taken (new token,
  ``coalesced = 0``: the first run covers whatever came before it). A live lease
  held by another message is *coalesced into*: ``coalesced + 1``, and the caller
  acknowledges its own message. A live lease held by an earlier delivery of the
  same message (JetStream redelivered it after that delivery went quiet) is
  waited out, then taken over.
- ``coalesce``: the same fold at send time, so a wake sent while its run is held
  is counted on the holder before ``send`` returns.
- ``renew``: the holder's heartbeat moves ``expires_at_ms``.
- ``finish``: the holder's handler answered Ack after covering ``covered``
  coalesced messages: re-run while the count is above it, else delete the entry.
- ``reserve``: a handoff keeps the run for the handed-off message's next
  delivery (``reserved``), so the run's other messages coalesce into it meanwhile.
- ``release``: a holder answering Redeliver, failing or cut off by shutdown lets
  the run go.

A holder that died keeps the run until its lease expires; then the first
message of the run to come (usually its own redelivery) takes over.

An entry is trusted only in range (``Lease.in_range``, security review H2): an
expiry no further ahead than a lease (with as much again for clock skew) and a
coalesced count in range. Anything else
(a hand-written ``{"holder": "msg_evil", "expires_at_ms": 99999999999999}``, say)
is logged and treated as a free run: taken over, never coalesced into.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import time
from dataclasses import dataclass, replace
from typing import Final

import nats.js.errors
from nats.js.kv import KeyValue

from treadle import errors
from treadle.world import messages

log = logging.getLogger("treadle.worlds.nats")

# JSStreamWrongLastSequenceErr and its constant form: a compare-and-set lost a race.
_CAS_CONFLICT_CODES: Final = frozenset({10071, 10164})
_MAX_CAS_TRIES: Final = 256


@dataclass(frozen=True, slots=True)
class Lease:
    """One run's lease as stored: who holds it, until when, and what was folded into it."""

    holder: str
    token: str
    expires_at_ms: int
    coalesced: int = 0
    reserved: bool = False

    def encode(self) -> bytes:
        return json.dumps(
            {
                "holder": self.holder,
                "token": self.token,
                "expires_at_ms": self.expires_at_ms,
                "coalesced": self.coalesced,
                "reserved": self.reserved,
            }
        ).encode()

    def in_range(self, now_ms: int, lease_ms: int) -> bool:
        """Could ``take``, ``renew`` or ``reserve`` have written this entry (``lease_ms``
        ahead at most, the same again allowed for clock skew between workers)?"""
        return (
            self.expires_at_ms <= now_ms + 2 * lease_ms
            and 0 <= self.coalesced <= messages.MAX_DELIVERY_COUNT
        )

    @classmethod
    def decode(cls, data: bytes) -> Lease | None:
        try:
            raw = json.loads(data)
            return cls(
                holder=str(raw["holder"]),
                token=str(raw["token"]),
                expires_at_ms=int(raw["expires_at_ms"]),
                coalesced=int(raw.get("coalesced", 0)),
                reserved=bool(raw.get("reserved", False)),
            )
        except (ValueError, KeyError, TypeError):
            return None  # unreadable: treated as a free run


@dataclass(frozen=True, slots=True)
class Held:
    """The delivery holds the run under ``token``."""

    token: str


@dataclass(frozen=True, slots=True)
class Coalesced:
    """The message was folded into the run's holder: acknowledge it."""


@dataclass(frozen=True, slots=True)
class Wait:
    """An earlier delivery of this message may still be live: look again after ``seconds``."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Rerun:
    """Messages were coalesced past ``covered``: run the handler again to cover ``coalesced``."""

    coalesced: int


@dataclass(frozen=True, slots=True)
class Released:
    """The lease is let go; acknowledge the message."""


@dataclass(frozen=True, slots=True)
class Lost:
    """The lease is no longer this delivery's (it lapsed and was taken over)."""


Take = Held | Coalesced | Wait
Finish = Rerun | Released | Lost


def _now_ms() -> int:
    return int(time.time() * 1000)


def _is_conflict(exc: BaseException) -> bool:
    if isinstance(exc, nats.js.errors.KeyWrongLastSequenceError):
        return True
    return isinstance(exc, nats.js.errors.APIError) and exc.err_code in _CAS_CONFLICT_CODES


class RunLeases:
    """Compare-and-set operations on the run lease bucket."""

    def __init__(self, kv: KeyValue, lease_seconds: float) -> None:
        self._kv = kv
        self._lease_ms = max(1, math.ceil(lease_seconds * 1000))
        # Per run lease key, the callers of a coalesce in flight (the first is its owner).
        self._folds: dict[str, list[asyncio.Future[bool]]] = {}

    async def _read(self, key: str) -> tuple[Lease | None, int]:
        """The lease and the revision a compare-and-set must name (0: no entry); an entry
        out of range (``Lease.in_range``) reads as no lease, so it is taken over."""
        try:
            entry = await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError as exc:
            marker = exc.entry  # a delete marker's revision, or None
            return None, int(marker.revision) if marker is not None else 0
        lease = Lease.decode(entry.value or b"")
        if lease is not None and not lease.in_range(_now_ms(), self._lease_ms):
            log.warning(
                "run lease %s: entry %r is out of range (forged or corrupt); treated as free",
                key,
                (entry.value or b"")[:200],
            )
            lease = None
        return lease, int(entry.revision or 0)

    async def _write(self, key: str, lease: Lease, revision: int) -> bool:
        try:
            await self._kv.update(key, lease.encode(), last=revision)
        except nats.js.errors.APIError as exc:
            if _is_conflict(exc):
                return False
            raise
        return True

    async def _delete(self, key: str, revision: int) -> bool:
        try:
            await self._kv.delete(key, last=revision)
        except nats.js.errors.APIError as exc:
            if _is_conflict(exc):
                return False
            raise
        return True

    def _fresh(self, message_id: str, *, reserved: bool = False) -> Lease:
        return Lease(
            holder=message_id,
            token=secrets.token_hex(8),
            expires_at_ms=_now_ms() + self._lease_ms,
            reserved=reserved,
        )

    async def take(self, key: str, message_id: str) -> Take:
        """Hold the run, coalesce into its holder, or wait out this message's earlier delivery."""
        for _ in range(_MAX_CAS_TRIES):
            lease, revision = await self._read(key)
            now = _now_ms()
            if (
                lease is None
                or lease.expires_at_ms <= now
                or (lease.holder == message_id and lease.reserved)
            ):
                fresh = self._fresh(message_id)
                if await self._write(key, fresh, revision):
                    return Held(fresh.token)
            elif lease.holder == message_id:
                return Wait((lease.expires_at_ms - now) / 1000)
            elif await self._write(key, replace(lease, coalesced=lease.coalesced + 1), revision):
                return Coalesced()
        raise _contended(key)

    async def coalesce(self, key: str) -> bool:
        """Fold a message being sent into the run's live holder; False when none holds it.

        Sends to one run from this process while a fold of it is in flight join that
        fold: one compare-and-set adds them all, where each used to race the others
        (a fan-out's completion wakes spent 110 ms each retrying).
        """
        fold = self._folds.get(key)
        if fold is not None:
            joined = asyncio.get_running_loop().create_future()
            fold.append(joined)
            return bool(await joined)
        fold = [asyncio.get_running_loop().create_future()]
        self._folds[key] = fold
        covered = 0  # the callers (in order) already counted on the holder
        try:
            for _ in range(_MAX_CAS_TRIES):
                lease, revision = await self._read(key)
                if lease is None or lease.expires_at_ms <= _now_ms():
                    break
                adding = len(fold) - covered
                folded = replace(lease, coalesced=lease.coalesced + adding)
                if await self._write(key, folded, revision):
                    for waiter in fold[covered : covered + adding]:
                        _answer(waiter, True)
                    covered += adding
                    if covered == len(fold):
                        break
            else:
                raise _contended(key)
        except BaseException as exc:
            del self._folds[key]
            failure = exc
            if not isinstance(exc, errors.WorldError):
                failure = errors.StorageUnavailable(f"run lease {key}: a fold was cut short")
            for waiter in fold[1:]:
                _answer(waiter, failure)
            if covered and isinstance(exc, Exception):
                return True  # this caller's message is counted on the holder already
            raise
        del self._folds[key]
        for waiter in fold[covered:]:
            _answer(waiter, False)  # no live holder (any more): they send their own
        return covered > 0

    async def renew(self, key: str, token: str) -> bool:
        """Extend the holder's lease; False once it is no longer this token's."""
        for _ in range(_MAX_CAS_TRIES):
            lease, revision = await self._read(key)
            if lease is None or lease.token != token:
                return False
            renewed = replace(lease, expires_at_ms=_now_ms() + self._lease_ms)
            if await self._write(key, renewed, revision):
                return True
        raise _contended(key)

    async def finish(self, key: str, token: str, covered: int) -> Finish:
        """After an Ack: re-run for uncovered coalesced messages, else let the run go."""
        for _ in range(_MAX_CAS_TRIES):
            lease, revision = await self._read(key)
            if lease is None or lease.token != token:
                return Lost()
            if lease.coalesced > covered:
                return Rerun(lease.coalesced)
            if await self._delete(key, revision):
                return Released()
        raise _contended(key)

    async def reserve(self, key: str, token: str, message_id: str) -> bool:
        """Keep the run for ``message_id``'s next delivery (a handoff); False if lost."""
        for _ in range(_MAX_CAS_TRIES):
            lease, revision = await self._read(key)
            if lease is None or lease.token != token:
                return False
            if await self._write(key, self._fresh(message_id, reserved=True), revision):
                return True
        raise _contended(key)

    async def release(self, key: str, token: str) -> None:
        """Let the run go, if this token still holds it."""
        for _ in range(_MAX_CAS_TRIES):
            lease, revision = await self._read(key)
            if lease is None or lease.token != token:
                return
            if await self._delete(key, revision):
                return
        raise _contended(key)

    async def release_holder(self, key: str, message_id: str) -> None:
        """Let the run go, if a delivery of ``message_id`` holds it (whatever its token).

        Only for a dead worker's delivery that was listed before its token
        (``liveness``): the caller knows no live delivery of that message can hold it.
        """
        for _ in range(_MAX_CAS_TRIES):
            lease, revision = await self._read(key)
            if lease is None or lease.holder != message_id:
                return
            if await self._delete(key, revision):
                return
        raise _contended(key)


def _answer(waiter: asyncio.Future[bool], outcome: bool | BaseException) -> None:
    if waiter.done():
        return  # a joiner that gave up waiting
    if isinstance(outcome, BaseException):
        waiter.set_exception(outcome)
    else:
        waiter.set_result(outcome)


def _contended(key: str) -> errors.StorageUnavailable:
    return errors.StorageUnavailable(
        f"run lease {key}: {_MAX_CAS_TRIES} compare-and-set attempts all lost a race"
    )
