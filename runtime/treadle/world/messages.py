"""Queue messages, what a handler is told about a delivery, and what it answers.

Every message is stamped with its run's spec version and deployment id, so a
World can route and gate it from the payload alone (seed 003, "Stamps at every
send site"). Two kinds:

- ``OrchestratorMessage``: a start (carries ``run_input``), a wake, a timer
  (``wait_continuation``), a wake-up (``complete_waits``) or a recovery.
- ``StepMessage``: one background step's message for its whole life.

A handler answers ``Ack``, ``Redeliver(seconds)`` (the same message again after
``seconds``, counted as an attempt) or ``Handoff`` (the same message again at
once, not counted); raising redelivers with backoff.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter

from treadle.world import constants


class _Message(BaseModel):
    # Unknown fields are ignored so an older handler can read a newer sender's message.
    model_config = ConfigDict(frozen=True, extra="ignore")

    run_id: str
    deployment_id: str | None = None


class RunInput(BaseModel):
    """What the start message carries so the first delivery can skip the log load (turbo)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    workflow_name: str
    input: JsonValue = None
    spec_version: int
    deployment_id: str | None = None
    created_at: datetime


class WaitContinuation(BaseModel):
    """The wait a timer message is for.

    ``resume_at_ms`` is set only on an intermediate hop of a long wait (every hop
    but the last); such a hop is never gated or coalesced.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    correlation_id: str
    hop_at_ms: int
    resume_at_ms: int | None = None


class OrchestratorMessage(_Message):
    kind: Literal["orchestrator"] = "orchestrator"
    run_spec_version: int | None = None
    run_input: RunInput | None = None
    wait_continuation: WaitContinuation | None = None
    complete_waits: list[str] | None = None
    recovery: bool = False
    # Re-routes of a misdelivered message (the deployment guard counts them).
    reroute_count: int = 0

    @property
    def is_intermediate_hop(self) -> bool:
        wc = self.wait_continuation
        return wc is not None and wc.resume_at_ms is not None

    @property
    def spec_version(self) -> int | None:
        """The stamp: ``run_input`` first, then ``run_spec_version``."""
        if self.run_input is not None:
            return self.run_input.spec_version
        return self.run_spec_version


class RunContext(BaseModel):
    """The run a step message belongs to, stamped at the send."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    spec_version: int
    deployment_id: str | None = None
    workflow_name: str


class StepMessage(_Message):
    kind: Literal["step"] = "step"
    step_id: str
    step_name: str
    run_context: RunContext
    step_created_at: datetime
    # True on a re-send: the handler reads the log even on a first delivery.
    step_resent: bool = False
    # The attempt this message starts: above 1 for an inline step's retry moved here.
    step_attempt: int = 1
    # The step's input when it fits the message; else the handler reads its creation event.
    input: JsonValue = None
    input_in_log: bool = False
    max_retries: int | None = None

    @property
    def spec_version(self) -> int:
        return self.run_context.spec_version


QueueMessage: TypeAlias = Annotated[OrchestratorMessage | StepMessage, Field(discriminator="kind")]
MESSAGE_ADAPTER: TypeAdapter[QueueMessage] = TypeAdapter(QueueMessage)
MessageKind: TypeAlias = Literal["orchestrator", "step"]


@dataclass(frozen=True, slots=True)
class Send:
    """One send of a batch: the message, its idempotency key, its delay."""

    message: OrchestratorMessage | StepMessage
    key: str | None = None
    delay_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class SendResult:
    message_id: str
    # True when a keyed send found its key taken: no new message was made.
    deduplicated: bool = False


@dataclass(frozen=True, slots=True)
class DeliveryMeta:
    """What a handler is told about the delivery it is in.

    ``delivery_count`` is 1 only on the message's first delivery; a coalesced
    re-run reports the delivery's count plus the re-run number. ``attempt`` is
    the queue's deliveries less those that followed a handoff; re-runs never
    raise it. ``invocation_started_at`` is the same for every re-run of one
    delivery (epoch milliseconds), so an inline deadline is measured from it.
    """

    message_id: str
    delivery_count: int
    attempt: int
    invocation_started_at: int
    key: str | None = None
    rerun: int = 0
    # Set by the queue once it knows this delivery's lease lapsed (its message may be
    # with another delivery now): the handler must stop at once, writing nothing more.
    lease_lost: asyncio.Event | None = field(default=None, compare=False)

    def lost_lease(self) -> bool:
        return self.lease_lost is not None and self.lease_lost.is_set()


@dataclass(frozen=True, slots=True)
class Ack:
    """Done: remove the message."""


@dataclass(frozen=True, slots=True)
class Redeliver:
    """Deliver the same message again after ``seconds``, counted as an attempt.

    A non-finite or over-long delay is clamped to ``MAX_REDELIVER_SECONDS``; it is
    never a handoff.
    """

    seconds: float

    def __post_init__(self) -> None:
        if not math.isnan(self.seconds) and self.seconds < 0:
            raise ValueError(f"Redeliver needs seconds >= 0, got {self.seconds}")


@dataclass(frozen=True, slots=True)
class Handoff:
    """Deliver the same message again at once, first in its run's line; not an attempt."""


def handoff_counted(handoffs: int) -> bool:
    """The handoff bound every queue keeps: once a message was handed off
    ``MAX_HANDOFFS`` times, a further ``Handoff`` is redelivered at once as an ordinary,
    counted delivery (its ``attempt`` rises), so a delivery that hands off for ever reaches
    the delivery cap instead of looping (audit bug 4)."""
    return handoffs >= constants.MAX_HANDOFFS


HandlerResult: TypeAlias = Ack | Redeliver | Handoff
ACK = Ack()
HANDOFF = Handoff()
