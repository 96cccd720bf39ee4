"""One delivery of a treadle message from JetStream: what it is and how its handler is called.

``read_delivery`` turns a JetStream message into a ``Delivery``: the treadle
message (its JSON payload), the identity and counts its headers carry
(``names.MESSAGE_ID``, ``KEY``, ``DELIVERY_OFFSET``, ``HANDOFFS``) and
JetStream's own delivery count, from which ``delivery_count`` and ``attempt``
follow as the contract defines them. Used by ``consumer``; how a handler is
called is ``treadle.world.queuerules``, shared by every queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TypeAlias

from nats.aio.msg import Msg

from treadle.world import messages, routing
from treadle.worlds.nats import names

log = logging.getLogger("treadle.worlds.nats")

Message: TypeAlias = messages.OrchestratorMessage | messages.StepMessage


@dataclass(slots=True)
class Delivery:
    """One JetStream delivery of a treadle message, as the consumer tracks it."""

    # The JetStream delivery answered to; a later redelivery this process adopts replaces it.
    msg: Msg
    # The stream sequence: JetStream's identity of this copy of the message.
    sequence: int
    message: Message
    message_id: str
    key: str | None
    # Deliveries so far, this one included: earlier copies' (handoffs) plus JetStream's.
    delivery_count: int
    handoffs: int
    # The run lease key of a gated message, and its token while this delivery holds it.
    gate_key: str | None
    # When the last in-progress ack was sent (monotonic): the lease runs from there.
    renewed_at: float
    token: str | None = None
    # Set once this delivery knows its lease lapsed (``DeliveryMeta.lease_lost``): the
    # handler stops, and the consumer never acks for it again.
    lease_lost: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def attempt(self) -> int:
        """Deliveries less those that followed a handoff (coalesced re-runs never count)."""
        return max(1, self.delivery_count - self.handoffs)


def read_delivery(msg: Msg, ns: names.Names) -> Delivery:
    """The delivery a JetStream message is; ``ValueError`` for a message treadle did not send."""
    headers = msg.headers or {}
    message_id = headers.get(names.MESSAGE_ID)
    if not message_id:
        raise ValueError(f"no {names.MESSAGE_ID} header")
    message = messages.MESSAGE_ADAPTER.validate_json(msg.data)
    raw_key = headers.get(names.KEY)
    offset = int(headers.get(names.DELIVERY_OFFSET, "0"))
    gate = routing.gated_run_id(message, None)
    return Delivery(
        msg=msg,
        sequence=msg.metadata.sequence.stream,
        message=message,
        message_id=message_id,
        key=names.decode_key(raw_key) if raw_key is not None else None,
        delivery_count=offset + msg.metadata.num_delivered,
        handoffs=int(headers.get(names.HANDOFFS, "0")),
        gate_key=ns.lease_key(gate) if gate is not None else None,
        renewed_at=time.monotonic(),
    )
