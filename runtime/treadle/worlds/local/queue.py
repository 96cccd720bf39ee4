"""The local World's durable queue: message rows in the World's SQLite file.

This module owns the rows and every state change of a message, each one a
function run on the database thread: ``send_many`` (with key dedupe and the
run gate decided at the send), ``claim`` (lapsed leases back to ready, due
messages leased, messages for a held run coalesced into the holder),
``renew`` (a live delivery's heartbeat), ``settle`` (what a handler's
answer does; past ``max_failed_deliveries`` failures, ``deadletters.move``) and
``hand_back`` (a message of a kind its consumer does not serve).
``dispatch.LocalConsumer`` drives them.

A message row is ``ready`` (waiting, perhaps delayed) or ``leased`` (being
delivered). A gated message (a spec 9 run's orchestrator message) joins its
run's line: while a leased row holds the run, a gated message that comes due
is deleted and counted on the holder (``coalesced``), and the holder's ack is
refused until it has re-run to cover that count.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from treadle.world import constants, contract, ids, messages, queuerules, records, routing
from treadle.worlds.local import deadletters
from treadle.worlds.local.database import Database, now_us, transaction

_US = 1_000_000


@dataclass(frozen=True, slots=True)
class Leased:
    message_id: str
    kind: str
    payload: str
    gate_run_id: str | None
    key: str | None
    delivery_count: int
    handoffs: int
    token: str
    # When the message came due (wall-clock microseconds): the queue lag's start.
    due_at_us: int | None = None


@dataclass(frozen=True, slots=True)
class Claimed:
    leased: list[Leased]
    # Wall-clock microseconds of the next due message or lease expiry, if any.
    next_due: int | None


# The handler raised (or answered something that is not a result): shared by every queue.
Failed = queuerules.Failed
Outcome = queuerules.Outcome


@dataclass(frozen=True, slots=True)
class Settled:
    # "done", "rerun" (coalesced count to cover), "stale" (lease lost), "dead".
    status: str
    coalesced: int = 0


def _run_spec_version(conn: sqlite3.Connection, run_id: str) -> int | None:
    row = conn.execute("SELECT spec_version FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else int(row[0])


def send_many(
    conn: sqlite3.Connection, sends: Sequence[tuple[messages.Send, str]]
) -> list[messages.SendResult]:
    """Insert messages (payloads already encoded), deduplicating keyed sends."""
    now = now_us()
    window_start = now - constants.QUEUE_MIN_STEP_KEY_DEDUPE_WINDOW_MS * 1000
    results: list[messages.SendResult] = []
    with transaction(conn):
        for send, payload in sends:
            message = send.message
            if send.key is not None:
                held = conn.execute(
                    "SELECT message_id FROM queue_keys WHERE idempotency_key = ? AND sent_at >= ?",
                    (send.key, window_start),
                ).fetchone()
                if held is not None:
                    results.append(messages.SendResult(message_id=held[0], deduplicated=True))
                    continue
            message_id = ids.new_message_id()
            if send.key is not None:
                conn.execute(
                    "INSERT OR REPLACE INTO queue_keys (idempotency_key, message_id, sent_at) "
                    "VALUES (?, ?, ?)",
                    (send.key, message_id, now),
                )
            version = None
            if isinstance(message, messages.OrchestratorMessage) and message.spec_version is None:
                version = _run_spec_version(conn, message.run_id)
            gate = routing.gated_run_id(message, version)
            if gate is not None and send.delay_seconds <= 0 and _coalesce(conn, gate):
                # Its run's delivery is in flight: the holder re-runs for it before it acks.
                results.append(messages.SendResult(message_id=message_id))
                continue
            back = conn.execute("SELECT COALESCE(MAX(line), 0) + 1 FROM queue_messages")
            conn.execute(
                "INSERT INTO queue_messages (message_id, kind, run_id, gate_run_id, "
                "idempotency_key, payload, state, available_at, line, first_sent_at) "
                "VALUES (?, ?, ?, ?, ?, ?, 'ready', ?, ?, ?)",
                (
                    message_id,
                    message.kind,
                    message.run_id,
                    gate,
                    send.key,
                    payload,
                    now + round(send.delay_seconds * _US),
                    back.fetchone()[0],
                    now,
                ),
            )
            results.append(messages.SendResult(message_id=message_id))
    return results


def _coalesce(conn: sqlite3.Connection, gate: str) -> bool:
    """Count a message on its run's in-flight delivery, if there is one."""
    cur = conn.execute(
        "UPDATE queue_messages SET coalesced = coalesced + 1 "
        "WHERE gate_run_id = ? AND state = 'leased'",
        (gate,),
    )
    return cur.rowcount > 0


def claim(
    conn: sqlite3.Connection, kinds: tuple[str, ...], capacity: int, lease_seconds: float
) -> Claimed:
    """Lease what is due (up to ``capacity``), coalescing messages for held runs."""
    now = now_us()
    lease_until = now + round(lease_seconds * _US)
    kind_marks = ", ".join("?" * len(kinds))
    leased: list[Leased] = []
    with transaction(conn):
        # A lease that lapsed (its delivery stalled or its consumer went away) is due again.
        conn.execute(
            "UPDATE queue_messages SET state = 'ready', lease_token = NULL, coalesced = 0 "
            "WHERE state = 'leased' AND lease_until < ?",
            (now,),
        )
        holders = dict(
            conn.execute(
                "SELECT gate_run_id, message_id FROM queue_messages "
                "WHERE state = 'leased' AND gate_run_id IS NOT NULL"
            ).fetchall()
        )
        # Payloads are read only for what is leased: the window is scanned for coalescing.
        due = conn.execute(
            "SELECT message_id, kind, gate_run_id, idempotency_key, delivery_count, handoffs, "
            f"available_at FROM queue_messages WHERE state = 'ready' AND available_at <= ? "
            f"AND kind IN ({kind_marks}) ORDER BY line LIMIT ?",
            (now, *kinds, capacity + 256),
        ).fetchall()
        for message_id, kind, gate, key, delivery_count, handoffs, due_at in due:
            if gate is not None and gate in holders:
                conn.execute("DELETE FROM queue_messages WHERE message_id = ?", (message_id,))
                conn.execute(
                    "UPDATE queue_messages SET coalesced = coalesced + 1 WHERE message_id = ?",
                    (holders[gate],),
                )
                continue
            if capacity <= 0:
                continue
            token = secrets.token_hex(8)
            conn.execute(
                "UPDATE queue_messages SET state = 'leased', delivery_count = delivery_count + 1, "
                "lease_token = ?, lease_until = ?, coalesced = 0 WHERE message_id = ?",
                (token, lease_until, message_id),
            )
            payload = conn.execute(
                "SELECT payload FROM queue_messages WHERE message_id = ?", (message_id,)
            ).fetchone()[0]
            capacity -= 1
            if gate is not None:
                holders[gate] = message_id
            leased.append(
                Leased(
                    message_id,
                    kind,
                    payload,
                    gate,
                    key,
                    delivery_count + 1,
                    handoffs,
                    token,
                    due_at,
                )
            )
        next_ready = conn.execute(
            f"SELECT MIN(available_at) FROM queue_messages WHERE state = 'ready' "
            f"AND kind IN ({kind_marks})",
            kinds,
        ).fetchone()[0]
        next_lapse = conn.execute(
            "SELECT MIN(lease_until) FROM queue_messages WHERE state = 'leased'"
        ).fetchone()[0]
    candidates = [t for t in (next_ready, next_lapse) if t is not None]
    return Claimed(leased, min(candidates) if candidates else None)


def renew(conn: sqlite3.Connection, message_id: str, token: str, lease_seconds: float) -> bool:
    """Extend a live lease; False once it has lapsed or been taken over."""
    now = now_us()
    with transaction(conn):
        until = now + round(lease_seconds * _US)
        cur = conn.execute(
            "UPDATE queue_messages SET lease_until = ? WHERE message_id = ? AND lease_token = ? "
            "AND lease_until >= ?",
            (until, message_id, token, now),
        )
        return cur.rowcount == 1


def settle(
    conn: sqlite3.Connection,
    leased: Leased,
    outcome: Outcome,
    covered: int,
    tuning: contract.QueueTuning,
) -> Settled:
    """Apply a handler's answer, if this delivery still holds its lease."""
    now = now_us()
    with transaction(conn):
        row = conn.execute(
            "SELECT coalesced FROM queue_messages WHERE message_id = ? AND lease_token = ? "
            "AND lease_until >= ?",
            (leased.message_id, leased.token, now),
        ).fetchone()
        if row is None:
            return Settled("stale")
        mid = leased.message_id
        match outcome:
            case messages.Ack():
                if row[0] > covered:
                    return Settled("rerun", coalesced=row[0])
                conn.execute("DELETE FROM queue_messages WHERE message_id = ?", (mid,))
            case messages.Redeliver(seconds=seconds):
                _ready(conn, mid, now + round(_clamp_delay(seconds) * _US))
            case messages.Handoff():
                if messages.handoff_counted(leased.handoffs):
                    _ready(conn, mid, now)  # past the bound: an ordinary, counted reschedule
                else:
                    front = conn.execute("SELECT COALESCE(MIN(line), 0) - 1 FROM queue_messages")
                    conn.execute(
                        "UPDATE queue_messages SET state = 'ready', available_at = ?, line = ?, "
                        "handoffs = handoffs + 1, lease_token = NULL, coalesced = 0 "
                        "WHERE message_id = ?",
                        (now, front.fetchone()[0], mid),
                    )
            case Failed(error=error):
                failures = leased.delivery_count - leased.handoffs
                if failures >= tuning.max_failed_deliveries:
                    deadletters.move(
                        conn,
                        message_id=mid,
                        kind=leased.kind,
                        payload=leased.payload,
                        delivery_count=leased.delivery_count,
                        error=error,
                        now=now,
                    )
                    return Settled("dead")
                delay = tuning.backoff_seconds(failures)
                _ready(conn, mid, now + round(delay * _US))
    return Settled("done")


def abandon(conn: sqlite3.Connection, leased: Leased) -> None:
    """A delivery cut off by shutdown: due again at once, counted above 1."""
    with transaction(conn):
        conn.execute(
            "UPDATE queue_messages SET state = 'ready', available_at = ?, lease_token = NULL, "
            "coalesced = 0 WHERE message_id = ? AND lease_token = ?",
            (now_us(), leased.message_id, leased.token),
        )


def recover(conn: sqlite3.Connection) -> None:
    """When a process becomes the consumer: a dead consumer's deliveries are due again."""
    now = now_us()
    with transaction(conn):
        conn.execute(
            "UPDATE queue_messages SET state = 'ready', available_at = MIN(available_at, ?), "
            "lease_token = NULL, coalesced = 0 WHERE state = 'leased'",
            (now,),
        )
        conn.execute(
            "DELETE FROM queue_keys WHERE sent_at < ?",
            (now - constants.QUEUE_MIN_STEP_KEY_DEDUPE_WINDOW_MS * 1000,),
        )


def backlog(conn: sqlite3.Connection, kind: str, deployment_id: str) -> int:
    """Due ``kind`` messages for ``deployment_id``: ready and due, or leased."""
    row = conn.execute(
        "SELECT COUNT(*) FROM queue_messages WHERE kind = ? "
        "AND (state = 'leased' OR available_at <= ?) "
        "AND json_extract(payload, '$.deployment_id') = ?",
        (kind, now_us(), deployment_id),
    ).fetchone()
    return int(row[0])


def _ready(conn: sqlite3.Connection, message_id: str, available_at: int) -> None:
    conn.execute(
        "UPDATE queue_messages SET state = 'ready', available_at = ?, lease_token = NULL, "
        "coalesced = 0 WHERE message_id = ?",
        (available_at, message_id),
    )


def _clamp_delay(seconds: float) -> float:
    return queuerules.clamp_redeliver_delay(seconds)


def hand_back(conn: sqlite3.Connection, leased: Leased, kind: str) -> bool:
    """A message this consumer does not serve (its row's kind was not its payload's):
    put it back, ready now and uncounted, under its payload's kind for a consumer that
    serves it."""
    with transaction(conn):
        cur = conn.execute(
            "UPDATE queue_messages SET state = 'ready', kind = ?, available_at = ?, "
            "delivery_count = MAX(delivery_count - 1, 0), lease_token = NULL, coalesced = 0 "
            "WHERE message_id = ? AND lease_token = ?",
            (kind, now_us(), leased.message_id, leased.token),
        )
        return cur.rowcount == 1


class LocalQueue:
    """Sends, starts consumers (``dispatch.LocalConsumer``), keeps dead letters."""

    def __init__(self, db: Database, tuning: contract.QueueTuning) -> None:
        self.db = db
        self._recovered = False
        self.tuning = tuning
        self.consumers: list[contract.Consumer] = []
        self._listeners: list[asyncio.Event] = []

    def add_listener(self, event: asyncio.Event) -> None:
        self._listeners.append(event)

    def remove_listener(self, event: asyncio.Event) -> None:
        if event in self._listeners:
            self._listeners.remove(event)

    def _wake(self) -> None:
        for event in self._listeners:
            event.set()

    async def send(
        self,
        message: messages.OrchestratorMessage | messages.StepMessage,
        *,
        key: str | None = None,
        delay_seconds: float = 0.0,
    ) -> messages.SendResult:
        (result,) = await self.send_batch([messages.Send(message, key, delay_seconds)])
        return result

    async def send_batch(self, sends: Sequence[messages.Send]) -> list[messages.SendResult]:
        prepared = [(send, _encode(send)) for send in sends]
        if not prepared:
            return []
        results = await self.db.call(functools.partial(send_many, sends=prepared))
        self._wake()
        return results

    async def backlog(self, kind: messages.MessageKind, deployment_id: str) -> int:
        return await self.db.call(
            functools.partial(backlog, kind=kind, deployment_id=deployment_id)
        )

    async def dead_letters(self, *, limit: int = 100) -> list[records.DeadLetter]:
        return await self.db.call(functools.partial(deadletters.listing, limit=limit))

    async def requeue_dead_letter(self, message_id: str) -> None:
        await self.db.call(functools.partial(deadletters.requeue, message_id=message_id))
        self._wake()

    async def drop_dead_letter(self, message_id: str) -> None:
        await self.db.call(functools.partial(deadletters.drop, message_id=message_id))

    async def consume(
        self,
        handlers: Mapping[messages.MessageKind, contract.Handler],
        *,
        concurrency: int = 32,
    ) -> contract.Consumer:
        from treadle.worlds.local.dispatch import LocalConsumer

        await self.db.take_consumer_lock()
        if not self._recovered:
            await self.db.call(recover)
            self._recovered = True
        consumer = LocalConsumer(self, dict(handlers), concurrency)
        consumer.start()
        self.consumers.append(consumer)
        return consumer


def _encode(send: messages.Send) -> str:
    return queuerules.encode_send(send)
