"""Queue messages, what a handler is told about a delivery, and what it answers.

Every message is stamped with its run's spec version and deployment id, so a
World can route and gate it from the payload alone (seed 003, "Stamps at every
send site"). Two kinds:

- ``OrchestratorMessage``: a start (carries ``run_input``), a wake, a timer
  (``wait_continuation``), a wake-up (``complete_waits``) or a recovery.
- ``StepMessage``: one background step's message for its whole life.

Every field a message or its delivery stamp carries is checked here, at the
boundary, against its range (security review H2): ids of their shape, spec
versions and counts in range. A payload outside them is not a treadle message
(every queue dead-letters it: ``MESSAGE_ADAPTER`` fails), and a delivery stamp
outside them is refused by ``DeliveryStamp`` (``queuerules.admit``). What a
message may *do* is still the log's to say: a step message carries ids and the
handler takes the step's name, input and retries from the run's log.

A handler answers ``Ack``, ``Redeliver(seconds)`` (the same message again after
``seconds``, counted as an attempt) or ``Handoff`` (the same message again at
once, not counted); raising redelivers with backoff.
"""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Literal, TypeAlias

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    TypeAdapter,
)

from treadle.world import constants

# The ranges a message's fields and a delivery's stamp are held to.
MAX_SPEC_VERSION = 999
MAX_NAME_CHARS = 512
MAX_DEPLOYMENT_ID_CHARS = 256
MAX_KEY_CHARS = 1024
MAX_STEP_ATTEMPT = 1_000_000
MAX_MAX_RETRIES = 1_000_000
MAX_REROUTE_COUNT = 64
MAX_COMPLETE_WAITS = 10_000
# A delivery count no queue reaches: far past every delivery cap and dead-letter bound.
MAX_DELIVERY_COUNT = 10_000_000
_ENTITY_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
# ``wrun_`` and letters, digits, ``_`` or ``-``: no dot, space, control or other character
# reaches a subject or a log line. (A minted id is a ULID, ``ids.RUN_ID_PATTERN``; one of
# another shape that passes here names no run and is acknowledged as such.)
_RUN_ID = re.compile(r"wrun_[A-Za-z0-9_-]{1,64}")
# A minted message id is ``msg_`` and 26 base32 characters; a queue may name a copy
# otherwise, so the boundary holds it to a safe token, as it does other ids.
_MESSAGE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _shaped(pattern: re.Pattern[str], what: str) -> AfterValidator:
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"{what} {value[:80]!r} is not of the expected shape")
        return value

    return AfterValidator(check)


def _printable(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError(f"{value[:80]!r} holds a control character")
    return value


RunId: TypeAlias = Annotated[str, _shaped(_RUN_ID, "run id")]
EntityId: TypeAlias = Annotated[str, _shaped(_ENTITY_ID, "id")]
MessageId: TypeAlias = Annotated[str, _shaped(_MESSAGE_ID, "message id")]
Name: TypeAlias = Annotated[
    str, Field(min_length=1, max_length=MAX_NAME_CHARS), AfterValidator(_printable)
]
DeploymentId: TypeAlias = Annotated[
    str, Field(min_length=1, max_length=MAX_DEPLOYMENT_ID_CHARS), AfterValidator(_printable)
]
SpecVersion: TypeAlias = Annotated[int, Field(ge=1, le=MAX_SPEC_VERSION)]
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def _traceparent(value: object) -> str | None:
    """A W3C ``traceparent`` of its shape (version, 32-hex trace id, 16-hex span id,
    flags), else None: a trace context is a hint for tracing only, so a malformed one is
    dropped at the boundary rather than dead-lettering the message it rides on."""
    if isinstance(value, str) and _TRACEPARENT.fullmatch(value) and value[:2] != "ff":
        return value
    return None


Traceparent: TypeAlias = Annotated[str | None, BeforeValidator(_traceparent)]
Millis: TypeAlias = Annotated[int, Field(ge=0, lt=1 << 48)]


class _Message(BaseModel):
    # Unknown fields are ignored so an older handler can read a newer sender's message.
    model_config = ConfigDict(frozen=True, extra="ignore")

    run_id: RunId
    deployment_id: DeploymentId | None = None
    # The run's W3C trace context (``treadle.telemetry``): set at start, copied onto every
    # message a delivery sends. Only a well-formed one is kept (see ``_traceparent``).
    traceparent: Traceparent = None


class RunInput(BaseModel):
    """What the start message carries so the first delivery can skip the log load (turbo)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    workflow_name: Name
    input: JsonValue = None
    spec_version: SpecVersion
    deployment_id: DeploymentId | None = None
    created_at: datetime
    # Never sent (excluded from the wire): what turbo's delivery reads of the run's
    # record beside the rest, so its synthesized ``run_created`` is the logged one.
    attributes: dict[str, JsonValue] = Field(default_factory=dict, exclude=True)


class WaitContinuation(BaseModel):
    """The wait a timer message is for.

    ``resume_at_ms`` is set only on an intermediate hop of a long wait (every hop
    but the last); such a hop is never gated or coalesced.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    correlation_id: EntityId
    hop_at_ms: Millis
    resume_at_ms: Millis | None = None


class OrchestratorMessage(_Message):
    kind: Literal["orchestrator"] = "orchestrator"
    run_spec_version: SpecVersion | None = None
    # A start's hint only: the delivery checks it against the run's record (turbo).
    run_input: RunInput | None = None
    wait_continuation: WaitContinuation | None = None
    # Read for backward compatibility and ignored: only a ``wake_requested`` in the
    # run's log completes a wait early (the log is the only source of truth, H2).
    complete_waits: Annotated[list[EntityId], Field(max_length=MAX_COMPLETE_WAITS)] | None = None
    recovery: bool = False
    # Re-routes of a misdelivered message (the deployment guard counts them).
    reroute_count: Annotated[int, Field(ge=0, le=MAX_REROUTE_COUNT)] = 0

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

    spec_version: SpecVersion
    deployment_id: DeploymentId | None = None
    workflow_name: Name


class StepMessage(_Message):
    """A background step's message: which step of which run (ids), never what to run.

    The handler reads the run's log on every delivery and runs only a step the log
    created under ``step_id`` with ``step_name``, with the input, retries, workflow and
    stamps the log holds. This runtime sends ``input_in_log=True`` and no ``input``; a
    message from an older sender that carries ``input`` is checked against the log's
    (a different one is refused), and an older handler reading a message of this one
    reads the input from the log, as it did for a large input.
    """

    kind: Literal["step"] = "step"
    step_id: EntityId
    step_name: Name
    run_context: RunContext
    step_created_at: datetime
    # True on a re-send (kept for older handlers: this one reads the log on every delivery).
    step_resent: bool = False
    # The attempt this message starts, as the sender saw it (the log's count decides).
    step_attempt: Annotated[int, Field(ge=1, le=MAX_STEP_ATTEMPT)] = 1
    # An older sender's copy of the step's input (checked against the log's).
    input: JsonValue = None
    input_in_log: bool = True
    max_retries: Annotated[int, Field(ge=0, le=MAX_MAX_RETRIES)] | None = None

    @property
    def spec_version(self) -> int:
        return self.run_context.spec_version


QueueMessage: TypeAlias = Annotated[OrchestratorMessage | StepMessage, Field(discriminator="kind")]
MESSAGE_ADAPTER: TypeAdapter[QueueMessage] = TypeAdapter(QueueMessage)
MessageKind: TypeAlias = Literal["orchestrator", "step"]


class DeliveryStamp(BaseModel):
    """What a queue says about one delivery besides the payload (NATS headers, a local
    queue row, a memory entry), held to its range before any handler sees it.

    ``carried`` is the count of deliveries the message *itself* says earlier copies of
    it had (a NATS handoff's ``Treadle-Delivery-Offset`` header): a queue's own record
    never sets it, and no run is failed on it alone (``DeliveryMeta.carried``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    message_id: MessageId
    key: Annotated[str, Field(min_length=1, max_length=MAX_KEY_CHARS)] | None = None
    delivery_count: Annotated[int, Field(ge=1, le=MAX_DELIVERY_COUNT)]
    handoffs: Annotated[int, Field(ge=0, le=constants.MAX_HANDOFFS)] = 0
    carried: Annotated[int, Field(ge=0, le=MAX_DELIVERY_COUNT)] = 0

    @property
    def attempt(self) -> int:
        return max(1, self.delivery_count - self.handoffs)


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
    # Of ``attempt``, the deliveries that only the message's own headers vouch for (earlier
    # copies of a NATS handoff): a run or step is never failed by its delivery cap on them
    # (``own_attempts``), so a forged offset header fails nothing (security review H2).
    carried: int = 0
    # Set by the queue once it knows this delivery's lease lapsed (its message may be
    # with another delivery now): the handler must stop at once, writing nothing more.
    lease_lost: asyncio.Event | None = field(default=None, compare=False)
    # When the message came due (epoch ms), where the queue knows it: the queue lag metric.
    due_at_ms: int | None = None

    def lost_lease(self) -> bool:
        return self.lease_lost is not None and self.lease_lost.is_set()

    @property
    def own_attempts(self) -> int:
        """The attempts the queue itself counted for this copy of the message."""
        return max(1, self.attempt - self.carried)


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
