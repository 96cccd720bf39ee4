"""The queue half of the World contract: ``Queue`` (its delivery rules), the
``Consumer`` it starts, the ``Handler`` it calls, the ``QueueTuning`` a World is
opened with, and ``DeadLetters``, the optional side of a queue that moves poison
messages aside.

Part of ``treadle.world.contract``, which re-exports every name here (callers use
``contract.Queue``); implemented by every World's queue, checked by
``treadle.world.conformance``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias, runtime_checkable

from treadle.world import messages, records

Handler: TypeAlias = Callable[
    [messages.OrchestratorMessage | messages.StepMessage, messages.DeliveryMeta],
    Awaitable[messages.HandlerResult],
]


@dataclass(frozen=True, slots=True)
class QueueTuning:
    """Queue timings a World is opened with; tests shorten them.

    ``lease_seconds``: how long a delivery holds its message without a heartbeat
    (a live delivery renews it every third of it). ``backoff_*``: redelivery
    delay after a handler raised, doubling per attempt from base up to max.
    ``max_failed_deliveries``: past it, a message whose handler raised again is
    moved to the dead letters (``DeadLetters``) instead of redelivered.
    ``worker_id`` and ``liveness_seconds``: the worker liveness rules
    (``treadle.world.liveness``): a consumer that starts with the identity of a dead
    one releases what that one held at once; a worker silent past ``liveness_seconds``
    is taken over by a survivor.
    """

    lease_seconds: float = 30.0
    backoff_base_seconds: float = 1.0
    backoff_max_seconds: float = 300.0
    # A message whose handler raised on this many deliveries moves to the dead letters.
    max_failed_deliveries: int = 64
    # The consuming worker's stable identity (``treadle.world.liveness``); None: a random
    # one per process. ``liveness_seconds``: how long its heartbeat may be silent before
    # another worker takes over what it holds.
    worker_id: str | None = None
    liveness_seconds: float = 3.0

    def backoff_seconds(self, attempt: int) -> float:
        delay: float = self.backoff_base_seconds * 2.0 ** max(attempt - 1, 0)
        return min(delay, self.backoff_max_seconds)


class Consumer(Protocol):
    async def close(self, *, grace_seconds: float = 30.0) -> None:
        """Stop taking deliveries; wait up to ``grace_seconds`` for running ones.

        A delivery still running after the grace is cancelled and its message is
        left to be redelivered (counted above 1), never acknowledged.
        """
        ...


class Queue(Protocol):
    """A durable queue with the spec 9 delivery rules.

    - ``message_id`` is stable across redeliveries; ``delivery_count`` is 1 only
      on the first delivery; ``attempt`` leaves out deliveries after a handoff.
    - ``Ack`` removes the message; ``Redeliver(n)`` delivers it again after ``n``
      seconds, counted; ``Handoff`` at once, not counted, first in the run's line;
      an exception redelivers with backoff; a delivery whose lease lapses (its
      process stalled or died) is delivered again, counted.
    - A send with a ``key`` is deduplicated for 24 h after the first send
      whatever state that message is in; an unkeyed send never is.
    - A delay is never cut short.
    - A spec 9 run's orchestrator messages (not intermediate hops) are delivered
      one at a time per run; one that comes due while its run's delivery runs is
      coalesced into it: the holder's handler runs again in the same delivery
      (``delivery_count + 1``, same ``attempt``) before it is acknowledged, at most
      ``MAX_COALESCED_RERUNS`` times, then the message is handed off.
    """

    async def send(
        self,
        message: messages.OrchestratorMessage | messages.StepMessage,
        *,
        key: str | None = None,
        delay_seconds: float = 0.0,
    ) -> messages.SendResult: ...

    async def send_batch(self, sends: Sequence[messages.Send]) -> list[messages.SendResult]: ...

    async def consume(
        self, handlers: Mapping[messages.MessageKind, Handler], *, concurrency: int = 32
    ) -> Consumer:
        """Start delivering messages of the kinds in ``handlers``."""
        ...

    async def backlog(self, kind: messages.MessageKind, deployment_id: str) -> int:
        """``kind`` messages for ``deployment_id`` not yet finished: due and waiting plus
        in flight (what an autoscaler of that deployment's workers scales on).

        Messages delayed and not yet due may be left out. A World whose consumers
        are per deployment (NATS) counts from when that deployment first consumed
        ``kind``; before that it answers 0.
        """
        ...


@runtime_checkable
class DeadLetters(Protocol):
    """A queue that moves poison messages aside (``treadle dead-letters``).

    A message is dead once its handler raised on ``max_failed_deliveries``
    deliveries, or at once when it is not a treadle message at all. It is kept,
    with why it died, until requeued (sent again as new: its counts start over)
    or dropped. Both raise ``DeadLetterNotFound`` for an id that is not dead.
    """

    async def dead_letters(self, *, limit: int = 100) -> list[records.DeadLetter]:
        """The dead letters, oldest first."""
        ...

    async def requeue_dead_letter(self, message_id: str) -> None: ...

    async def drop_dead_letter(self, message_id: str) -> None: ...
