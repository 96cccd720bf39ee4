"""The rules of concurrency and rate limits every World keeps (``docs/limits.md``).

A World stores, per (scope, key), the **holders** (at most ``max``), the
**waiters** (each with a priority and an arrival number) and, for a rate, the
token bucket's theoretical arrival time plus each holder's **reservation**.
A scope is ``workflow:<name>`` or ``step:<name>``; a holder is a run id (a
workflow's slot belongs to its run, not to a worker) or ``<run id>/<step id>``
(a step's slot belongs to the step until its outcome, so an attempt abandoned by
a dead worker keeps it until the step's redelivered attempt takes it back: two
bodies of one key never overlap past ``max``).

- **acquire** (one transaction per key): holders that are dead (``holder_dead``)
  are dropped first; a holder asking again is held (idempotent); else the claim
  ranks among the waiters by (priority descending, arrival ascending), keeping
  its arrival number if it waited already, and is admitted iff fewer than
  ``max - holders`` waiters rank ahead of it (``admits``); otherwise it is
  recorded (or stays) waiting. A newcomer never passes a waiter of its
  priority, so a woken waiter finds its slot free.
- **release**: the holder's rows go; the waiters now admissible (the first
  ``max - holders`` by rank) are returned as ``Wake``s whose stored message the
  caller sends under ``wake_key`` (a repeated wake is deduplicated).
- **sweep**: every World-wide pass (each worker, every
  ``TREADLE_LIMIT_SWEEP_SECONDS``) drops dead holders and dead waiters and
  returns the admissible waiters of every key: a wake lost to a crash between
  a holder's end and its release is sent again.
- **reserve** (rates, GCRA): ``reservation`` gives the time a holder may start
  and the bucket's next state; a holder's reservation is kept, so a redelivery
  waits for the same instant, never takes a second token.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

HolderKind = Literal["workflow", "step"]
LimitKind = Literal["concurrency", "rate"]


def workflow_scope(name: str) -> str:
    return f"workflow:{name}"


def step_scope(name: str) -> str:
    return f"step:{name}"


def step_holder(run_id: str, step_id: str) -> str:
    return f"{run_id}/{step_id}"


@dataclass(frozen=True, slots=True)
class Claim:
    """A holder asking for a slot of (scope, key), at most ``max`` holders."""

    scope: str
    key: str
    max: int
    holder: str
    run_id: str
    kind: HolderKind
    priority: int = 0
    # The queue message (JSON) that wakes this holder once admitted.
    wake: str = ""


@dataclass(frozen=True, slots=True)
class RateClaim:
    """A holder asking for a start of (scope, key): one per ``interval_ms``, ``burst`` at once."""

    scope: str
    key: str
    holder: str
    run_id: str
    kind: HolderKind
    interval_ms: int
    burst: int = 1


@dataclass(frozen=True, slots=True)
class Admission:
    held: bool
    # 1-based place among the key's waiters when not held.
    position: int = 0


@dataclass(frozen=True, slots=True)
class Wake:
    """A waiter to wake: send ``message`` (JSON of a queue message) under ``key``."""

    run_id: str
    holder: str
    message: str
    key: str


@dataclass(frozen=True, slots=True)
class WaitingOn:
    """What a run waits on, for ``treadle runs get/list`` and the API."""

    run_id: str
    limit: LimitKind
    scope: str
    key: str
    holder: str
    priority: int = 0
    position: int = 0
    since: datetime | None = None
    until: datetime | None = None  # a rate's reserved start

    def describe(self) -> str:
        if self.limit == "rate":
            until = self.until.isoformat() if self.until is not None else "?"
            return f"rate {self.scope} key {self.key!r} until {until}"
        return f"concurrency {self.scope} key {self.key!r} (position {self.position})"


def wake_key(holder: str, arrival: int) -> str:
    """The idempotency key of a waiter's wake: one per wait (its arrival number)."""
    return f"limit:{holder}:{arrival}"


def rank_key(priority: int, arrival: int) -> tuple[int, int]:
    """Waiters sort by this: higher priority first, then arrival order (FIFO)."""
    return (-priority, arrival)


def admits(holders: int, maximum: int, ahead: int) -> bool:
    """A claim with ``ahead`` waiters ranked before it takes a slot now."""
    return ahead < maximum - holders


def admissible(holders: int, maximum: int) -> int:
    """How many waiters (from the head) a key can admit now."""
    return max(maximum - holders, 0)


def holder_dead(*, run_terminal: bool, step_ended: bool = False) -> bool:
    """A holder (or waiter) whose run ended, or whose step has its outcome, holds nothing."""
    return run_terminal or step_ended


@dataclass(frozen=True, slots=True)
class Reservation:
    at_ms: int  # the start this holder may make
    tat_ms: int  # the bucket's theoretical arrival time after it


def reservation(tat_ms: int | None, now_ms: int, interval_ms: int, burst: int) -> Reservation:
    """GCRA with reservation: ``burst`` starts at once, then one per ``interval_ms``."""
    base = max(tat_ms if tat_ms is not None else now_ms, now_ms)
    tolerance = (burst - 1) * interval_ms
    return Reservation(at_ms=max(now_ms, base - tolerance), tat_ms=base + interval_ms)
