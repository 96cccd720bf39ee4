"""Seed 000's decision table, applied to one spec 8 suspension's unsettled steps.

``Table.plan`` folds each created, unsettled step's ownership from the log
(``ownership.apply``: latest ``step_started`` wins, ``step_retrying`` ends it) and
decides, per step not running in this delivery:

- owned by this message, lease active: execute here (owned recovery; its
  ``step_started`` re-stamps the owner) - unless this delivery lost the step's
  single-flight to another delivery of this process, which then arms the backstop;
- owned by another message, lease active: ensure the backstop wake (a plain run
  continuation, delayed by the lease remainder, keyed by the ownership epoch);
- otherwise (never owned, ownership lapsed, lease expired, kill switch): the
  immediate step message under the step's stable key (the queue dedupes it).

``owned_open`` is the ack invariant's check: the unsettled steps this message owns
and has neither run nor handed to their own message. Pure; used by ``spec8.delivery``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from treadle import clock
from treadle.orchestrator.logstate import LogState, StepState
from treadle.orchestrator.spec8 import ownership
from treadle.world import events


@dataclass(frozen=True)
class Planned:
    step: StepState
    action: ownership.Action
    delay_seconds: float = 0.0
    key: str | None = None


def owners(
    loaded: Iterable[events.LoggedEvent], wanted: set[str]
) -> dict[str, ownership.Ownership]:
    """The ownership of each step in ``wanted``, folded from the log in one walk."""
    state: dict[str, ownership.Ownership] = {}
    for logged in loaded:
        cid = logged.event.correlation_id
        if cid is None or cid not in wanted or logged.event.type not in events.STEP_TYPES:
            continue
        state[cid] = ownership.apply(state.get(cid, ownership.UNCREATED), logged.event,
                                     logged.created_at)  # fmt: skip
    return state


def exhausted(step: StepState, max_retries: int, message_id: str) -> events.StepFailed:
    """The failure of an owned step whose next attempt would pass ``max_retries + 1``
    (a ``max_retries=0`` step started once is never run again: at most once)."""
    return events.StepFailed(
        correlation_id=step.step_id,
        step_name=step.step_name,
        attempt=step.starts,
        error=events.ErrorInfo(
            message=f"step {step.step_name} was started {step.starts} time(s) by delivery "
            f"{message_id}, which died mid-body; max_retries={max_retries} allows no more",
            type="StepAttemptsExhausted",
        ),
    )


@dataclass
class Table:
    my_message_id: str
    lease_seconds: float
    enabled: bool = True
    # Steps this delivery handed to their own message (no inline slot for a recovery).
    handed_off: set[str] = field(default_factory=set)
    backstops_armed: int = 0

    def plan(
        self,
        state: LogState,
        loaded: Iterable[events.LoggedEvent],
        *,
        running: set[str],
        absorbed: set[str],
        now: datetime | None = None,
    ) -> list[Planned]:
        unsettled = (state.open_inline_steps | state.open_background_steps) - running
        if not unsettled:
            return []
        folded = owners(loaded, unsettled)
        now = clock.utcnow() if now is None else now
        out: list[Planned] = []
        for cid in sorted(unsettled):  # sorted: a seed must replay
            decided = ownership.dispatch(
                folded.get(cid, ownership.UNCREATED),
                correlation_id=cid,
                my_message_id=self.my_message_id,
                now=now,
                lease_seconds=self.lease_seconds,
                enabled=self.enabled,
            )
            if decided is None:
                continue
            step = state.steps[cid]
            action = decided.action
            if action is ownership.Action.EXECUTE and cid in absorbed | self.handed_off:
                own = folded[cid]
                assert own.last_started_at is not None
                if cid in self.handed_off:
                    continue  # its message runs it; nothing more to send
                remaining = ownership.lease_remaining(self.lease_seconds, own.last_started_at, now)
                key = ownership.backstop_key(cid, own.last_started_at)
                out.append(Planned(step, ownership.Action.BACKSTOP, remaining, key))
                continue
            out.append(Planned(step, action, decided.delay_seconds, decided.idempotency_key))
        return out

    def owned_open(
        self, state: LogState, loaded: Iterable[events.LoggedEvent], *, absorbed: set[str]
    ) -> list[str]:
        """Unsettled steps this message owns (lease or not) that nobody else will run."""
        unsettled = state.open_inline_steps | state.open_background_steps
        folded = owners(loaded, unsettled)
        return sorted(
            cid
            for cid, own in folded.items()
            if own.phase is ownership.Phase.OWNED
            and own.owner_message_id == self.my_message_id
            and cid not in self.handed_off | absorbed
        )
