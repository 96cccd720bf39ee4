"""Queue rules that every World's queue applies the same way: pure, no I/O.

- ``admit``: a delivery's stamp (message id, key, counts) held to its range
  (``messages.DeliveryStamp``) before any handler or run lease sees it; out of
  range is ``MessageRefused`` and the queue dead-letters the message; and
  ``read_message``: the payload, or ``MessageRefused`` naming the first bad field.
- ``encode_send``: a send's checks (a finite delay >= 0, a non-empty key, the
  size limit) and its payload text.
- ``clamp_redeliver_delay``: a ``Redeliver`` delay, non-finite or over-long
  clamped to ``MAX_REDELIVER_SECONDS`` (never a handoff).
- ``call_handler``: calls a handler and maps what it did to an ``Outcome``:
  its answer, or ``Failed`` when it raised or answered something else.
- ``deliver_with_reruns``: one delivery's handler calls: the coalesced re-runs
  (``delivery_count + rerun``, same ``attempt`` and start time) while the queue
  refuses the ack, at most ``MAX_COALESCED_RERUNS``, then a handoff.

Used by the queues (``treadle.worlds.local``, ``treadle.worlds.nats``,
``treadle.testing.memory``), so a fix to one of these rules lands once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeAlias

import pydantic

from treadle import clock, errors
from treadle.world import constants, contract, messages

log = logging.getLogger("treadle.world.queue")


@dataclass(frozen=True, slots=True)
class Failed:
    """The handler raised (or answered something that is not a result)."""

    error: str


Outcome: TypeAlias = messages.HandlerResult | Failed


def _first_error(exc: pydantic.ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "value"
    return f"{where}: {first['msg']}"


def read_message(payload: str | bytes) -> messages.OrchestratorMessage | messages.StepMessage:
    """The treadle message a payload is; ``MessageRefused`` (one line, the first field out
    of its range or shape) for anything else."""
    try:
        return messages.MESSAGE_ADAPTER.validate_json(payload)
    except pydantic.ValidationError as exc:
        raise errors.MessageRefused(f"not a treadle message ({_first_error(exc)})") from None


def admit(
    *,
    message_id: str | None,
    key: str | None,
    delivery_count: int,
    handoffs: int = 0,
    carried: int = 0,
    max_carried: int | None = None,
    run_id: str | None = None,
) -> messages.DeliveryStamp:
    """A delivery's stamp, held to its range (every queue calls this before the handler,
    and NATS before the run lease): an id of the wrong shape, a count below 1 or past
    ``MAX_DELIVERY_COUNT``, handoffs past ``MAX_HANDOFFS`` or more than the deliveries
    they followed, or more deliveries carried from earlier copies than ``max_carried``
    (the queue's dead-letter bound: no copy is handed off past it), are
    ``MessageRefused``. A forged header is refused, never acted on; one in range only
    ever counts as ``carried``, on which no run is failed."""
    if message_id is None:
        raise errors.MessageRefused("it has no message id", run_id=run_id)
    try:
        stamp = messages.DeliveryStamp(
            message_id=message_id,
            key=key,
            delivery_count=delivery_count,
            handoffs=handoffs,
            carried=carried,
        )
    except pydantic.ValidationError as exc:
        raise errors.MessageRefused(
            f"its delivery stamp is out of range ({_first_error(exc)})",
            message_id=message_id[:80],
            run_id=run_id,
        ) from None
    if handoffs >= delivery_count:
        raise errors.MessageRefused(
            f"its delivery stamp says {handoffs} handoff(s) after {delivery_count - 1} "
            "earlier deliveries; each handoff follows a delivery",
            message_id=message_id,
            run_id=run_id,
        )
    if max_carried is not None and carried > max_carried:
        raise errors.MessageRefused(
            f"its delivery stamp carries {carried} deliveries of earlier copies, more than "
            f"the {max_carried} after which a message is dead-lettered",
            message_id=message_id,
            run_id=run_id,
        )
    if carried >= delivery_count:
        raise errors.MessageRefused(
            f"its delivery stamp carries {carried} deliveries of {delivery_count}",
            message_id=message_id,
            run_id=run_id,
        )
    return stamp


def encode_send(send: messages.Send) -> str:
    """The message's payload text, after the checks every send passes."""
    delay = send.delay_seconds
    if not math.isfinite(delay) or delay < 0:
        raise errors.WorldContractError(
            f"run {send.message.run_id}: a send's delay must be a finite number of seconds "
            f">= 0, got {delay}",
            run_id=send.message.run_id,
        )
    if send.key is not None and not send.key:
        raise errors.WorldContractError("an idempotency key must not be empty")
    payload = send.message.model_dump_json()
    size = len(payload.encode())
    if size > constants.MAX_MESSAGE_BYTES:
        raise errors.MessageTooLarge(
            size=size, limit=constants.MAX_MESSAGE_BYTES, run_id=send.message.run_id
        )
    return payload


def payload_deployment(payload: str) -> str | None:
    """The ``deployment_id`` an encoded message names (None when none, or unreadable):
    what ``Queue.backlog`` counts by where the queue keeps only payloads."""
    try:
        value = json.loads(payload).get("deployment_id")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def clamp_redeliver_delay(seconds: float) -> float:
    """A Redeliver delay the queue honours: 0 .. MAX_REDELIVER_SECONDS, NaN and inf clamped."""
    if not math.isfinite(seconds):
        return constants.MAX_REDELIVER_SECONDS
    return min(max(seconds, 0.0), constants.MAX_REDELIVER_SECONDS)


async def call_handler(
    handler: contract.Handler,
    message: messages.OrchestratorMessage | messages.StepMessage,
    meta: messages.DeliveryMeta,
) -> Outcome:
    """Run the handler once; an exception or a stray answer becomes ``Failed``."""
    try:
        result = await handler(message, meta)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.warning(
            "run %s: handler for message %s raised %s: %s; redelivering with backoff",
            message.run_id,
            meta.message_id,
            type(exc).__name__,
            exc,
            exc_info=log.isEnabledFor(logging.DEBUG),
        )
        return Failed(f"{type(exc).__name__}: {exc}")
    if not isinstance(result, messages.Ack | messages.Redeliver | messages.Handoff):
        log.error(
            "run %s: handler answered %r, not Ack, Redeliver or Handoff; redelivering",
            message.run_id,
            result,
        )
        return Failed(f"handler answered {result!r}")
    return result


class Settlement(Protocol):
    """What a queue's settle answers: ``status`` "rerun" (with the ``coalesced`` count
    the re-run must cover) or anything else (the delivery is over)."""

    @property
    def status(self) -> str: ...

    @property
    def coalesced(self) -> int: ...


Settle: TypeAlias = Callable[[Outcome, int], Awaitable[Settlement]]


async def deliver_with_reruns(
    handler: contract.Handler,
    message: messages.OrchestratorMessage | messages.StepMessage,
    *,
    message_id: str,
    delivery_count: int,
    handoffs: int,
    key: str | None,
    lease_lost: asyncio.Event | None,
    settle: Settle,
    stopped: Callable[[], bool] = lambda: False,
    carried: int = 0,
    due_at_ms: int | None = None,
) -> None:
    """Run one delivery: call the handler, settle its answer (``settle(outcome, covered)``),
    and re-run it in the same delivery while the queue says messages were coalesced into
    it; past ``MAX_COALESCED_RERUNS`` re-runs, hand the message off. ``stopped()`` ends it
    before a further call (a dead process). ``carried``: of the attempts, those only the
    message's own headers vouch for (``DeliveryMeta.carried``). ``due_at_ms``: when the
    message came due, where the queue knows it (``DeliveryMeta.due_at_ms``)."""
    started_ms = clock.now_ms()
    attempt = max(1, delivery_count - handoffs)
    rerun = covered = 0
    while not stopped():
        meta = messages.DeliveryMeta(
            message_id=message_id,
            delivery_count=delivery_count + rerun,
            attempt=attempt,
            invocation_started_at=started_ms,
            key=key,
            rerun=rerun,
            lease_lost=lease_lost,
            carried=min(carried, max(attempt - 1, 0)),
            due_at_ms=due_at_ms,
        )
        outcome = await call_handler(handler, message, meta)
        settled = await settle(outcome, covered)
        if settled.status != "rerun":
            return
        if rerun >= constants.MAX_COALESCED_RERUNS:
            log.info(
                "run %s: %d coalesced re-runs used up; handing off message %s",
                message.run_id,
                rerun,
                message_id,
            )
            await settle(messages.HANDOFF, covered)
            return
        covered = settled.coalesced
        rerun += 1
