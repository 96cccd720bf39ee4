"""Inline step message ownership for spec 8 runs (seed 000), as pure decisions.

Spec 8 does not serialize a run's deliveries: a hook or a timer can wake the
run in another delivery while an inline step's body is still running in the
first one. Seed 000 stops that wake from running the body a second time by
recording, on the lazy ``step_started`` that creates an inline step, the queue
message id of the delivery running the body (``owner_message_id``), and by
honouring that ownership for a bounded lease.

This module owns the rules, with no I/O, so every replayer derives the same
answer from the same log and tests can walk the state machine directly:

- ``fold_ownership``: the ownership state of one step from its events. The
  latest ``step_started`` wins (a stamped start sets the owner, a bare start
  clears it); ``step_retrying`` ends ownership for good; a terminal event ends
  the step.
- ``lease_remaining``: ``min(lease, max(0, last_started_at + lease - now))``;
  the outer ``min`` is the clock-skew clamp (the start time is the World's
  clock, ``now`` the delivery's).
- ``backstop_key``: ``<correlationId>:backstop:<lastStartedAt>``, scoped to the
  ownership epoch so an owner recovery's re-stamp can arm a fresh backstop
  while the previous one is in flight.
- ``dispatch``: the decision table (execute as owner / ensure a backstop wake /
  the immediate keyed enqueue).

Called by the spec 8 delivery when it walks the pending steps of a
suspension. The in-process single-flight lives in ``singleflight``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from treadle.world import events

DEFAULT_LEASE_SECONDS = 860.0
MIN_LEASE_SECONDS = 1.0
# The queue's longest per-message delay: one delayed backstop always suffices.
MAX_LEASE_SECONDS = 900.0


class Phase(enum.Enum):
    """Where a step stands for the ownership rules."""

    UNCREATED = "uncreated"
    OWNED = "owned"  # created by a stamped start, no retry, not terminal
    UNOWNED = "unowned"  # created; never owned, cleared by a bare start, or queue-owned
    TERMINAL = "terminal"


@dataclass(frozen=True)
class Ownership:
    """One step's ownership, folded from its events in log order."""

    phase: Phase
    owner_message_id: str | None = None
    last_started_at: datetime | None = None
    # True once a step_retrying was seen: the step is queue-owned from then on.
    lapsed: bool = False


UNCREATED = Ownership(Phase.UNCREATED)


def fold_ownership(logged: Iterable[events.LoggedEvent], correlation_id: str) -> Ownership:
    """The ownership state of ``correlation_id`` after ``logged`` (in slot order)."""
    state = UNCREATED
    for record in logged:
        if record.event.correlation_id == correlation_id:
            state = apply(state, record.event, record.created_at)
    return state


def apply(state: Ownership, event: events.Event, at: datetime) -> Ownership:
    """The ownership state after one more event of the step (seed 000's state machine)."""
    if state.phase is Phase.TERMINAL:
        return state
    if isinstance(event, (events.StepCompleted, events.StepFailed)):
        return Ownership(Phase.TERMINAL, lapsed=state.lapsed)
    if isinstance(event, events.StepRetrying):
        # Ownership ends for good: retries are queue-owned under the correlation id key.
        return Ownership(Phase.UNOWNED, last_started_at=state.last_started_at, lapsed=True)
    if isinstance(event, events.StepCreated):
        if state.phase is Phase.UNCREATED:
            return Ownership(Phase.UNOWNED)
        return state
    if isinstance(event, events.StepStarted):
        owner = event.owner_message_id
        if owner is not None and not state.lapsed:
            return Ownership(Phase.OWNED, owner_message_id=owner, last_started_at=at)
        # A bare start (a queued retry attempt, an older runtime) clears the owner.
        return Ownership(Phase.UNOWNED, last_started_at=at, lapsed=state.lapsed)
    return state


def clamp_lease(seconds: float) -> float:
    """``WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS`` clamped to 1..900."""
    return min(MAX_LEASE_SECONDS, max(MIN_LEASE_SECONDS, seconds))


def lease_remaining(lease_seconds: float, last_started_at: datetime | None, now: datetime) -> float:
    """Seconds of ownership left; 0 when the start time is missing (degraded mode)."""
    if last_started_at is None:
        return 0.0
    left = (last_started_at - now).total_seconds() + lease_seconds
    return min(lease_seconds, max(0.0, left))


def backstop_key(correlation_id: str, last_started_at: datetime) -> str:
    """The backstop wake's idempotency key, one per ownership epoch."""
    stamp = last_started_at.isoformat(timespec="microseconds").replace("+00:00", "Z")
    return f"{correlation_id}:backstop:{stamp}"


class Action(enum.Enum):
    EXECUTE = "execute"  # owned recovery in this delivery
    BACKSTOP = "backstop"  # ensure a delayed plain run continuation
    ENQUEUE = "enqueue"  # the immediate step message keyed by the correlation id


@dataclass(frozen=True)
class Dispatch:
    action: Action
    delay_seconds: float = 0.0
    idempotency_key: str | None = None


def dispatch(
    state: Ownership,
    *,
    correlation_id: str,
    my_message_id: str | None,
    now: datetime,
    lease_seconds: float,
    enabled: bool = True,
) -> Dispatch | None:
    """Seed 000's decision table for one created, non-terminal pending step.

    ``None`` for a step that is uncreated (the lazy inline or eager path decides)
    or terminal (nothing pending). ``enabled=False`` is the kill switch
    ``WORKFLOW_INLINE_OWNERSHIP=0``: the immediate keyed enqueue, as before.
    """
    if state.phase in (Phase.UNCREATED, Phase.TERMINAL):
        return None
    enqueue = Dispatch(Action.ENQUEUE, idempotency_key=correlation_id)
    if not enabled or state.phase is not Phase.OWNED or state.last_started_at is None:
        return enqueue
    remaining = lease_remaining(lease_seconds, state.last_started_at, now)
    if remaining <= 0:
        return enqueue
    if my_message_id is not None and state.owner_message_id == my_message_id:
        return Dispatch(Action.EXECUTE)
    return Dispatch(
        Action.BACKSTOP,
        delay_seconds=remaining,
        idempotency_key=backstop_key(correlation_id, state.last_started_at),
    )
