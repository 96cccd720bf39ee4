"""One delivery of a treadle message from JetStream: what it is and how its handler is called.

``read_delivery`` turns a JetStream message into a ``Delivery``: the treadle
message (its JSON payload), the identity and counts its headers carry
(``names.MESSAGE_ID``, ``KEY``, ``DELIVERY_OFFSET``, ``HANDOFFS``) and
JetStream's own delivery count, from which ``delivery_count`` and ``attempt``
follow as the contract defines them. Payload and headers are held to their
ranges first (``queuerules.read_message``, ``queuerules.admit``): a header out of
range (an offset below the handoffs, handoffs past ``MAX_HANDOFFS``, a count
that is no number) is ``MessageRefused``, and the message is dead-lettered
before it takes any run lease. What only the headers vouch for (deliveries of
earlier copies) reaches the handler as ``DeliveryMeta.carried``. Used by
``consumer``; how a handler is called is ``treadle.world.queuerules``, shared by
every queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeAlias

from nats.aio.msg import Msg

from treadle import errors
from treadle.world import messages, queuerules, routing
from treadle.worlds.nats import names

log = logging.getLogger("treadle.worlds.nats")

Message: TypeAlias = messages.OrchestratorMessage | messages.StepMessage


class DeliveryLease(asyncio.Event):
    """A delivery's ``lease_lost``: set when the consumer learns the lease lapsed, and
    also read as set the moment its worker's liveness lapsed (``expired``), with no task
    having run to set it: a handler checking it right after a stalled loop resumes
    stops before it writes (``liveness.WorkerLiveness``)."""

    def __init__(self, expired: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self.expired = expired

    def is_set(self) -> bool:
        if super().is_set():
            return True
        if self.expired is not None and self.expired():
            self.set()
            return True
        return False


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
    lease_lost: DeliveryLease = field(default_factory=DeliveryLease)

    # Of the deliveries, those counted on earlier copies: only the headers say so.
    carried: int = 0

    @property
    def attempt(self) -> int:
        """Deliveries less those that followed a handoff (coalesced re-runs never count)."""
        return max(1, self.delivery_count - self.handoffs)


def _count(headers: dict[str, str], name: str, message_id: str, run_id: str) -> int:
    raw = headers.get(name, "0")
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 12):
        raise errors.MessageRefused(
            f"header {name} is {raw[:40]!r}, not a count", message_id=message_id, run_id=run_id
        )
    return int(raw)


def read_delivery(msg: Msg, ns: names.Names, *, max_carried: int | None = None) -> Delivery:
    """The delivery a JetStream message is; ``MessageRefused`` (or ``ValueError``) for a
    message treadle did not send or whose headers are out of range."""
    headers = msg.headers or {}
    message_id = headers.get(names.MESSAGE_ID)
    if not message_id:
        raise ValueError(f"no {names.MESSAGE_ID} header")
    message = queuerules.read_message(msg.data)
    raw_key = headers.get(names.KEY)
    offset = _count(headers, names.DELIVERY_OFFSET, message_id, message.run_id)
    handoffs = _count(headers, names.HANDOFFS, message_id, message.run_id)
    key = names.decode_key(raw_key) if raw_key is not None else None
    stamp = queuerules.admit(
        message_id=message_id,
        key=key,
        delivery_count=offset + msg.metadata.num_delivered,
        handoffs=handoffs,
        carried=offset - handoffs,
        max_carried=max_carried,
        run_id=message.run_id,
    )
    gate = routing.gated_run_id(message, None)
    return Delivery(
        msg=msg,
        sequence=msg.metadata.sequence.stream,
        message=message,
        message_id=stamp.message_id,
        key=stamp.key,
        delivery_count=stamp.delivery_count,
        handoffs=stamp.handoffs,
        gate_key=ns.lease_key(gate) if gate is not None else None,
        renewed_at=time.monotonic(),
        carried=stamp.carried,
    )
