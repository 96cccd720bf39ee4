"""Forged queue messages for the H2 tests: put straight onto the queue, as an attacker would.

On Postgres + NATS a bare ``nats.connect(url)`` publishes to the run's JetStream
subject with whatever payload and headers the test writes (security.md H2 did
exactly this), and writes the run lease KV entry it likes. On the local World
the row goes straight into the ``queue_messages`` table. ``settled`` waits until
the queue no longer holds the message (consumed, acked or dead-lettered).
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from typing import Any

import nats

from treadle.world import ids, messages, routing
from treadle.worlds.local import LocalWorld
from treadle.worlds.local.database import now_us, transaction
from treadle.worlds.nats import names as nats_names
from treadle.worlds.production import PostgresNatsWorld

DEPLOYMENT = "local"  # the engine fixtures' deployment id
WAIT_SECONDS = 20.0


def step_payload(
    run_id: str,
    step_id: str,
    step_name: str,
    *,
    input: Any = None,
    input_in_log: bool = False,
    workflow_name: str = "victim",
) -> dict[str, Any]:
    return {
        "kind": "step",
        "run_id": run_id,
        "deployment_id": DEPLOYMENT,
        "step_id": step_id,
        "step_name": step_name,
        "run_context": {
            "spec_version": 9,
            "deployment_id": DEPLOYMENT,
            "workflow_name": workflow_name,
        },
        "step_created_at": datetime.now(UTC).isoformat(),
        "input": input,
        "input_in_log": input_in_log,
    }


def start_payload(run_id: str, workflow_name: str, input: Any) -> dict[str, Any]:
    return {
        "kind": "orchestrator",
        "run_id": run_id,
        "deployment_id": DEPLOYMENT,
        "run_input": {
            "workflow_name": workflow_name,
            "input": input,
            "spec_version": 9,
            "deployment_id": DEPLOYMENT,
            "created_at": datetime.now(UTC).isoformat(),
        },
    }


def wake_payload(run_id: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "orchestrator", "run_id": run_id, "run_spec_version": 9, **extra}


class Forger:
    """Writes forged messages onto the World's own queue, below every treadle API."""

    def __init__(self, world: Any, nats_url: str | None) -> None:
        # The engine fixtures hand the app a lazy wrapper; the forger needs the World itself.
        self.world = getattr(world, "_world", None) or world
        self.nats_url = nats_url
        self._nc: Any = None

    @property
    def is_nats(self) -> bool:
        return isinstance(self.world, PostgresNatsWorld)

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()

    async def _js(self) -> Any:
        if self._nc is None:
            assert self.nats_url is not None
            self._nc = await nats.connect(self.nats_url)
        return self._nc.jetstream()

    async def publish(
        self,
        payload: dict[str, Any],
        *,
        headers: dict[str, str] | None = None,
        delivery_count: int = 0,
        handoffs: int = 0,
    ) -> str:
        """Put one message on the queue; its message id. ``headers`` (NATS) are sent as
        given on top of a fresh ``Treadle-Message-Id``; ``delivery_count`` and ``handoffs``
        (local) are the row's counts."""
        message_id = ids.new_message_id()
        data = json.dumps(payload)
        if self.is_nats:
            queue = self.world.nats
            subject = queue.names.subject(payload["kind"], None, payload["run_id"])
            js = await self._js()
            await js.publish(
                subject,
                data.encode(),
                headers={nats_names.MESSAGE_ID: message_id, **(headers or {})},
            )
            return message_id
        assert isinstance(self.world, LocalWorld)
        message = messages.MESSAGE_ADAPTER.validate_python(payload)
        gate = routing.gated_run_id(message, 9)

        def insert(conn: Any) -> None:
            now = now_us()
            with transaction(conn):
                line = conn.execute(
                    "SELECT COALESCE(MAX(line), 0) + 1 FROM queue_messages"
                ).fetchone()[0]
                conn.execute(
                    "INSERT INTO queue_messages (message_id, kind, run_id, gate_run_id, "
                    "idempotency_key, payload, state, available_at, line, first_sent_at, "
                    "delivery_count, handoffs) "
                    "VALUES (?, ?, ?, ?, NULL, ?, 'ready', ?, ?, ?, ?, ?)",
                    (
                        message_id,
                        payload["kind"],
                        payload["run_id"],
                        gate,
                        data,
                        now,
                        line,
                        now,
                        delivery_count,
                        handoffs,
                    ),
                )

        await self.world.local_queue.db.call(insert)
        self.world.local_queue._wake()  # another writer of the file would not wake it either
        return message_id

    async def put_lease(self, run_id: str, entry: dict[str, Any]) -> None:
        """Write the run's lease KV entry (NATS only), as the review's squat did."""
        queue = self.world.nats
        js = await self._js()
        kv = await js.key_value(queue.names.lease_bucket)
        await kv.put(queue.names.lease_key(run_id), json.dumps(entry).encode())

    async def settled(self, message_id: str, kind: str = "orchestrator") -> None:
        """Until the queue holds the message no more (acked or dead-lettered)."""
        deadline = time.monotonic() + WAIT_SECONDS
        while await self._held(message_id, kind):
            assert time.monotonic() < deadline, f"message {message_id} still queued"
            await asyncio.sleep(0.05)  # polling the queue's state: nothing announces an ack

    async def quiet(self, run_id: str) -> None:
        """Until the queue holds no message of the run (its lingering delivery is over), so a
        forged message is not coalesced into a live delivery but delivered on its own."""
        deadline = time.monotonic() + WAIT_SECONDS
        while await self._busy(run_id):
            assert time.monotonic() < deadline, f"run {run_id} still has queued messages"
            await asyncio.sleep(0.05)  # polling the queue's state: nothing announces an ack

    async def _busy(self, run_id: str) -> bool:
        if self.is_nats:
            backlog: int = await self.world.nats.pending("orchestrator", DEPLOYMENT)
            return backlog > 0

        def count(conn: Any) -> int:
            row = conn.execute(
                "SELECT COUNT(*) FROM queue_messages WHERE run_id = ?", (run_id,)
            ).fetchone()
            return int(row[0])

        return bool(await self.world.local_queue.db.call(count))

    async def _held(self, message_id: str, kind: str) -> bool:
        if self.is_nats:
            backlog: int = await self.world.nats.pending(kind, DEPLOYMENT)
            return backlog > 0

        def count(conn: Any) -> int:
            row = conn.execute(
                "SELECT COUNT(*) FROM queue_messages WHERE message_id = ?", (message_id,)
            ).fetchone()
            return int(row[0])

        return bool(await self.world.local_queue.db.call(count))

    async def dead_letter_ids(self) -> set[str]:
        queue = self.world.nats if self.is_nats else self.world.local_queue
        return {d.message_id for d in await queue.dead_letters()}
