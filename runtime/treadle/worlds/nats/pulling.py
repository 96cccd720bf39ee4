"""Pull requests against one durable consumer, sized to the consumer's free delivery slots.

``consumer.NatsConsumer`` runs one ``Puller`` per message kind it handles; the
pullers share one ``Slots`` (the ``concurrency`` of ``consume``). A puller asks
JetStream for at most as many messages as there are free slots not already
promised to an open pull request, and for no more than its kind's fair part of
the idle slots (``Slots.share``); each request has its own reply subject, so
its end (a ``408`` when it expires, any other status on error) is known, and
every message goes to ``deliver`` the moment it arrives (counted against the
oldest open request: the server fills them in order). Requests expire after
``PULL_EXPIRES_SECONDS``, so slots promised to an idle kind return to the pool;
when slots are scarce the kind that asked longest ago asks first.
Closing unsubscribes the reply inbox; the server then drops the open requests
(it checks for interest before it delivers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

log = logging.getLogger("treadle.worlds.nats")

PULL_EXPIRES_SECONDS: Final = 1.0
# A request whose end never arrived is forgotten this long after it expired.
_END_GRACE_SECONDS: Final = 2.0
# After an error status (consumer gone, leader change): wait before asking again.
_ERROR_PAUSE_SECONDS: Final = 1.0
_STATUS: Final = "Status"
_IDLE_HEARTBEAT: Final = "100"
_EXPIRED: Final = ("404", "408")


class Slots:
    """Delivery slots shared by a consumer's pullers: running deliveries plus promised ones."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.running = 0
        self.promised = 0
        # Per puller (its wake event): what it has promised, and when it last asked.
        self._promised_by: dict[asyncio.Event, int] = {}
        self._asked_at: dict[asyncio.Event, float] = {}

    @property
    def free(self) -> int:
        return self.capacity - self.running - self.promised

    def listen(self, event: asyncio.Event) -> None:
        self._promised_by[event] = 0
        self._asked_at[event] = 0.0

    def share(self) -> int:
        """The most one puller may have promised: its fair part of the idle slots."""
        return max(1, math.ceil((self.capacity - self.running) / len(self._promised_by)))

    def may_ask(self, puller: asyncio.Event) -> bool:
        """Whether ``puller`` may ask now: when slots are scarce, a puller with nothing
        promised goes first, the one that asked longest ago first among them."""
        if self.free >= len(self._promised_by):
            return True
        idle = [p for p, n in self._promised_by.items() if n == 0]
        if not idle:
            return True
        return puller is min(idle, key=lambda p: self._asked_at[p])

    def promise(self, puller: asyncio.Event, count: int) -> None:
        """Move ``puller``'s promised slots by ``count`` (an ask, a message, an end)."""
        self.promised += count
        self._promised_by[puller] += count
        if count > 0:
            self._asked_at[puller] = time.monotonic()

    def finished(self) -> None:
        """A delivery ended: its slot is free again."""
        self.running -= 1
        self.wake()

    def wake(self) -> None:
        for event in self._promised_by:
            event.set()


@dataclass(slots=True)
class _Request:
    remaining: int
    forget_at: float


class Puller:
    """Keeps pull requests open on one consumer while its kind has free slots."""

    def __init__(
        self,
        nc: Client,
        *,
        stream: str,
        consumer: str,
        slots: Slots,
        deliver: Callable[[Msg], None],
    ) -> None:
        self._nc = nc
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._consumer = consumer
        self._slots = slots
        self._deliver = deliver
        self._requests: dict[str, _Request] = {}
        self._serial = 0
        self._wake = asyncio.Event()
        self._paused_until = 0.0
        self._inbox = ""
        self._sub: Subscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        slots.listen(self._wake)

    async def start(self) -> None:
        self._inbox = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_reply)
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"treadle-nats-pull-{self._consumer}"
        )

    async def stop(self) -> None:
        """Ask for nothing more; open requests die with the inbox."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            task, self._task = self._task, None
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._sub is not None:
            sub, self._sub = self._sub, None
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._forget(list(self._requests))

    async def _run(self) -> None:
        while not self._stopping:
            self._wake.clear()
            now = time.monotonic()
            self._forget([t for t, r in self._requests.items() if r.forget_at <= now])
            promised = sum(r.remaining for r in self._requests.values())
            want = min(self._slots.free, self._slots.share() - promised)
            timeout = PULL_EXPIRES_SECONDS
            if now < self._paused_until:
                timeout = self._paused_until - now
            elif want > 0 and self._slots.may_ask(self._wake):
                try:
                    await self._request(want)
                except Exception as exc:
                    log.warning("consumer %s: a pull request failed: %s", self._consumer, exc)
                    self._paused_until = time.monotonic() + _ERROR_PAUSE_SECONDS
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()

    async def _request(self, batch: int) -> None:
        self._serial += 1
        token = str(self._serial)
        self._requests[token] = _Request(
            batch, time.monotonic() + PULL_EXPIRES_SECONDS + _END_GRACE_SECONDS
        )
        self._slots.promise(self._wake, batch)
        body = {"batch": batch, "expires": int(PULL_EXPIRES_SECONDS * 1_000_000_000)}
        await self._nc.publish(
            self._next_subject, json.dumps(body).encode(), reply=f"{self._inbox}.{token}"
        )

    def _forget(self, tokens: list[str]) -> None:
        for token in tokens:
            request = self._requests.pop(token, None)
            if request is not None:
                self._slots.promise(self._wake, -request.remaining)

    async def _on_reply(self, msg: Msg) -> None:
        status = (msg.headers or {}).get(_STATUS)
        if status is not None:
            # A status comes on the reply subject of the request it ends.
            token = msg.subject.rpartition(".")[2]
            if status == _IDLE_HEARTBEAT:
                return
            if status not in _EXPIRED:
                description = (msg.headers or {}).get("Description", "")
                log.warning(
                    "consumer %s: pull request ended with %s %s",
                    self._consumer,
                    status,
                    description.strip(),
                )
                self._paused_until = time.monotonic() + _ERROR_PAUSE_SECONDS
            self._forget([token])
            self._slots.wake()
            return
        # A message comes on its own subject, not the request's: the server answers one
        # consumer's requests in the order they were made, so it fills the oldest one.
        for token, request in self._requests.items():
            request.remaining -= 1
            self._slots.promise(self._wake, -1)
            if request.remaining <= 0:
                del self._requests[token]
                self._wake.set()
            break
        self._slots.running += 1
        self._deliver(msg)
