"""Pure decisions the orchestrator takes from what it knows of the log.

No I/O here, so each rule is unit-tested on its own: which steps a delivery
re-sends, which waits are due, which inline steps a dead delivery left
open, how a suspension's creations split into batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from treadle.orchestrator.logstate import LogState, StepState, WaitState
from treadle.replay import operations
from treadle.world import constants, events

RESEND_MAX_AGE = timedelta(milliseconds=constants.STEP_RESEND_MAX_AGE_MS)


@dataclass(frozen=True)
class Resend:
    step: StepState
    attempt: int
    delay_seconds: float


def steps_to_resend(state: LogState, *, now: datetime, recovery: bool) -> list[Resend]:
    """The re-send rule (seed 003): what a delivery counted above 1 sends again.

    Every background step created but not started, created less than 23 h ago; every
    inline step whose last event is the orchestrator's ``step_retrying`` that moved its
    retry to a message, less than 23 h ago. A recovery delivery (a lost queue) also
    re-sends started background steps without an outcome, with no age bound.
    """
    out: list[Resend] = []
    # Sorted: a set of strings iterates in hash-seed order, and a seed must replay.
    for step_id in sorted(state.open_background_steps | state.open_inline_steps):
        step = state.steps[step_id]
        if not step.inline:
            unstarted = step.starts == 0 and now - step.created_at < RESEND_MAX_AGE
            if unstarted or recovery:
                out.append(Resend(step, step.starts + 1, 0.0))
        elif (
            step.last_type == "step_retrying"
            and step.moved_by is not None
            and step.moved_at is not None
            and now - step.moved_at < RESEND_MAX_AGE
        ):
            delay = 0.0
            if step.retry_after is not None:
                delay = max((step.retry_after - now).total_seconds(), 0.0)
            out.append(Resend(step, step.starts + 1, delay))
    return out


def due_waits(state: LogState, *, now_ms: int, woken: set[str]) -> list[WaitState]:
    """Open waits to complete now: due by the clock, or named by a wake-up; earliest first."""
    due = [w for w in state.open_waits() if _ms(w.resume_at) <= now_ms or w.wait_id in woken]
    return sorted(due, key=lambda w: (w.resume_at, w.slot))


def near_due_waits(state: LogState, *, now_ms: int, window_ms: float) -> list[WaitState]:
    """Open waits due within the near-due window (not yet due)."""
    return [w for w in state.open_waits() if now_ms < _ms(w.resume_at) <= now_ms + window_ms]


def inline_to_rerun(state: LogState, running: set[str]) -> list[StepState]:
    """Inline steps a dead delivery started: a start, no outcome, not running here.

    A step whose retry an orchestrator moved to the step's own message is no longer in
    ``open_inline_steps`` (``LogState``): that message's attempts are not a dead
    delivery's, and the step is never run inline again (audit bug 1 / F1).
    """
    return [
        step
        for step_id in sorted(state.open_inline_steps - running)
        if (step := state.steps[step_id]).last_type == "step_started"
    ]


def step_creation(
    call: operations.StepCall, *, inline: bool, creator_message_id: str
) -> list[events.Event]:
    """The events that create a step: an inline step's first start, or ``step_created``."""
    cid, name = call.correlation_id, call.step_name
    if call.input_error is not None:
        # Arguments that cannot be serialized: a placeholder creation and the failure.
        return [
            events.StepCreated(
                correlation_id=cid,
                step_name=name,
                inline=True,
                position=call.position,
                max_retries=call.max_retries,
            ),
            events.StepFailed(
                correlation_id=cid,
                step_name=name,
                attempt=1,
                error=events.ErrorInfo(message=call.input_error, type="SerializationError"),
            ),
        ]
    if inline:
        return [
            events.StepStarted(
                correlation_id=cid,
                step_name=name,
                attempt=1,
                inline=True,
                input=call.input,
                position=call.position,
                max_retries=call.max_retries,
            )
        ]
    return [
        events.StepCreated(
            correlation_id=cid,
            step_name=name,
            input=call.input,
            inline=False,
            creator_message_id=creator_message_id,
            position=call.position,
            max_retries=call.max_retries,
        )
    ]


def creation_batches(batch: list[events.Event]) -> list[list[events.Event]]:
    """At most 64 events and 512 KiB a batch (payload plus 1 KiB each); a big one alone."""
    if len(batch) <= 1:
        return [batch] if batch else []  # one event goes alone whatever its size
    chunks: list[list[events.Event]] = []
    current: list[events.Event] = []
    size = 0
    for event in batch:
        cost = len(event.model_dump_json()) + 1024
        if current and (
            len(current) >= constants.MAX_IN_BAND_CREATION_BATCH_EVENTS
            or size + cost > constants.MAX_IN_BAND_CREATION_BATCH_BYTES
        ):
            chunks.append(current)
            current, size = [], 0
        current.append(event)
        size += cost
    if current:
        chunks.append(current)
    return chunks


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)
