"""The background step's message handler (a body's one attempt: ``stepbody``).

``execute`` (``treadle.orchestrator.stepbody``, re-exported here) runs one attempt of a
step body and turns what happened into an outcome. ``handle_step_message`` is the
handler of a background step's one message (seed 003 "One delivery of a step message"):
on every delivery it reads the run's record and the step's own events
(``events.list_entity``, never the whole log: a delivery costs the same in a run of
10,000 events as of 10), writes ``step_started`` out-of-band (a stale start, refused as
``StaleStepStart``, or a lease lost meanwhile, runs no body), runs the body, writes the
outcome, wakes the orchestrator, and acknowledges, or asks for the same message again to
retry in place. Under the opt-in ``WORKFLOW_OPTIMISTIC_BACKGROUND_START`` the body of a
plain first delivery starts while its ``step_started`` is in flight, and its outcome is
discarded unless that start committed (``orchestrator.turbo``).

The log is the only source of truth for a step (security review H2): the message names a
run and a step (ids and the step's name); the handler runs only a step the log created
under that id with that name, with the input, retries, workflow name and stamps the log
holds. A message naming a step the log never created, under another name, or carrying an
input other than the log's, runs nothing, writes nothing, and is acknowledged with a
warning naming the run (a forged or stale message). So a plain first delivery reads the
step's events too, unlike the seed's turbo path for steps: two small reads per step
message are the price. The run's stamps come from its record, which follows a
``run_repinned``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import JsonValue

from treadle import clock, errors
from treadle.orchestrator import limitgate, steptimeouts, streamflush, turbo
from treadle.orchestrator.runtime import Runtime
from treadle.orchestrator.stepbody import Outcome, error_info, execute, outcome_event
from treadle.sdk import functions
from treadle.world import constants, events, messages, records

log = logging.getLogger("treadle.orchestrator.steps")

__all__ = ["Outcome", "error_info", "execute", "handle_step_message", "outcome_event"]

# Tries of a background step's outcome write on a storage error, and the first backoff.
WRITE_ATTEMPTS = 3
WRITE_RETRY_SECONDS = 0.1

NO_ACTIVITY_BEFORE_CAP = timedelta(milliseconds=constants.QUEUE_MIN_STEP_REDELIVERY_SPAN_MS)


@dataclass
class _StepLog:
    run_terminal: bool = False
    outcome: bool = False
    starts: int = 0
    input: JsonValue = None
    retry_after: datetime | None = None
    last_type: str = ""
    last_activity: datetime | None = None
    # The run, as its record has it (``runs.get``: its row, folded from its log).
    run: records.RunRecord | None = None
    # The step's creation: its step_created, or an inline step's first step_started.
    creation: events.StepCreated | events.StepStarted | None = None
    # How many of the step's events were read (a delivery reads only its own step's).
    events_read: int = 0

    def apply(self, logged: events.LoggedEvent) -> None:
        """Fold one of the step's own events (slot order)."""
        event = logged.event
        self.events_read += 1
        self.last_activity = logged.created_at
        if self.creation is None and (
            isinstance(event, events.StepCreated)
            or (isinstance(event, events.StepStarted) and event.inline)
        ):
            self.creation = event
        if isinstance(event, events.StepCreated) or (
            isinstance(event, events.StepStarted) and event.input is not None
        ):
            self.input = event.input
        if self.outcome:
            return  # events after the outcome are inert
        self.last_type = event.type
        if isinstance(event, events.StepStarted):
            self.starts += 1
        elif isinstance(event, events.StepRetrying):
            self.retry_after = event.retry_after
        elif event.type in events.STEP_OUTCOME_TYPES:
            self.outcome = True


async def _read_step_log(rt: Runtime, run_id: str, step_id: str) -> _StepLog:
    """What a step message's delivery decides on: the run's record (its status, workflow,
    deployment and format) and the step's own events, read by correlation id
    (``events.list_entity``), so a delivery, a redelivery or a retry hop reads the few
    events of its step and never the rest of the run's log (seed 003 follow-up 3): its
    cost is the same at slot 20 as at slot 20,000. ``RunNotFound`` for no run. (Two
    small reads, one after the other: the run's row first, so a run that ended is seen
    ended by the step's events read after it.)"""
    run = await rt.world.runs.get(run_id)
    page = await rt.world.events.list_entity(run_id, step_id)
    state = _StepLog(run_terminal=run.is_terminal, run=run)
    while True:
        for logged in page.events:
            if logged.correlation_id == step_id:  # the World's filter, held to it
                state.apply(logged)
        if not page.has_more:
            return state
        page = await rt.world.events.list_entity(run_id, step_id, after_slot=page.cursor)


async def _wake(rt: Runtime, message: messages.StepMessage) -> None:
    wake = rt.wake_message(
        message.run_id, message.deployment_id, spec_version=message.run_context.spec_version
    )
    await rt.world.queue.send(wake)


async def write_outcome_retrying(
    write: Callable[[], Awaitable[object]], *, run_id: str, step_name: str, attempt: int, what: str
) -> None:
    """An attempt's outcome written by ``write``, a storage error retried
    (``WRITE_ATTEMPTS`` in all, backing off): the body ran, and a redelivery would find
    the attempt started with no outcome and re-run it, or, on the last attempt, fail
    the step as exhausted though its body returned (simulation seed 320 for a
    background step, 1178 for a spec 8 inline one). A retry after an unknown outcome
    that had committed is refused as ``StepAlreadyEnded`` (raised to the caller): the
    first write's outcome stands. Shared by the step handler and ``spec8.bodies``."""
    for tries in range(1, WRITE_ATTEMPTS + 1):
        try:
            await write()
            return
        except errors.StorageUnavailable as exc:
            if tries == WRITE_ATTEMPTS:
                raise
            log.warning(
                "run %s: writing step %s attempt %d's %s failed (%s); trying again",
                run_id,
                step_name,
                attempt,
                what,
                exc,
            )
            await asyncio.sleep(WRITE_RETRY_SECONDS * 2 ** (tries - 1))


async def _write_outcome(
    rt: Runtime, message: messages.StepMessage, attempt: int, outcome: Outcome
) -> bool:
    """The attempt's outcome, out-of-band (``write_outcome_retrying``). The World refuses
    a second outcome (StepAlreadyEnded): another delivery's attempt won, and its outcome
    stands. It refuses an outcome of an attempt a later start superseded
    (``StaleStepOutcome``: this body outlived its timeout or lease, and a redelivery runs
    the next attempt): False, and the caller writes and sends nothing more (the latest
    attempt's delivery owns the step)."""
    event = outcome_event(message.step_id, message.step_name, attempt, outcome)
    try:
        await write_outcome_retrying(
            lambda: rt.world.events.create(message.run_id, event, in_band=False),
            run_id=message.run_id,
            step_name=message.step_name,
            attempt=attempt,
            what=event.type,
        )
    except errors.StepAlreadyEnded as exc:
        log.info(
            "run %s: step %s attempt %d finished after the step's outcome at slot %d; "
            "that outcome stands, this %s is dropped",
            message.run_id,
            message.step_name,
            attempt,
            exc.outcome_slot,
            event.type,
        )
    except errors.StaleStepOutcome as exc:
        log.info(
            "run %s: step %s attempt %d's %s refused: attempt %d started after it "
            "(this attempt was abandoned); writing nothing more",
            message.run_id,
            message.step_name,
            attempt,
            event.type,
            exc.latest_attempt,
        )
        return False
    return True


async def _write_start(
    rt: Runtime,
    message: messages.StepMessage,
    meta: messages.DeliveryMeta,
    start: events.StepStarted,
) -> bool:
    """The attempt's ``step_started``, out-of-band; False when the run or step ended.

    A storage error may have come after the start committed (seed 003 "Unknown
    outcome"). The redelivery would then find the attempt started with no outcome: a
    ``max_retries=0`` step is failed as exhausted, its body never run (simulation seed
    8). So the handler reads the step's log: a start of this attempt found there is its
    own (the message's delivery is the step's owner), and its body runs; none found,
    the error stands and the queue redelivers the message, which starts it afresh. That
    read is retried as an outcome write is (``WRITE_ATTEMPTS``, backing off) while the
    delivery holds its lease: one failed read used to let the redelivery exhaust a
    ``max_retries=0`` step whose start had landed, its body never run (soak seed 318).

    A start whose attempt is not past the step's latest started one is refused as
    ``StaleStepStart`` (allocating nothing) and raised to the caller: a later delivery
    owns the step (simulation seed 522).
    """
    try:
        await rt.world.events.create(message.run_id, start, in_band=False)
        return True
    except errors.StorageUnavailable as exc:
        state = await _read_back(rt, message, meta, exc)
        if state.run_terminal:
            return False  # the run ended: no body, no wake
        if state.outcome:
            await _wake(rt, message)
            return False
        if state.starts < start.attempt:
            raise
        if state.starts > start.attempt:
            # Later attempts are in the log: whatever became of this start, it is stale.
            raise errors.StaleStepStart(
                message.run_id,
                step_id=message.step_id,
                attempt=start.attempt,
                latest_attempt=state.starts,
            ) from exc
        log.warning(
            "run %s: step %s attempt %d's start had an unknown outcome and is in the log; "
            "running its body",
            message.run_id,
            message.step_name,
            start.attempt,
        )
        return True


async def _read_back(
    rt: Runtime,
    message: messages.StepMessage,
    meta: messages.DeliveryMeta,
    unknown: errors.StorageUnavailable,
) -> _StepLog:
    """The step's log after its start's write had an unknown outcome; the write's error
    (``unknown``) once the reads fail ``WRITE_ATTEMPTS`` times or the lease is lost."""
    for tries in range(1, WRITE_ATTEMPTS + 1):
        try:
            return await _read_step_log(rt, message.run_id, message.step_id)
        except errors.StorageUnavailable:
            if tries == WRITE_ATTEMPTS or meta.lost_lease():
                raise unknown from None
        await asyncio.sleep(WRITE_RETRY_SECONDS * 2 ** (tries - 1))
    raise unknown  # not reached: the last try returns or raises


async def _start_refused(
    rt: Runtime,
    message: messages.StepMessage,
    meta: messages.DeliveryMeta,
    start: events.StepStarted,
    max_retries: int,
) -> messages.HandlerResult | None:
    """Write the attempt's start; None when the body may run (or its outcome be written),
    else the delivery's answer. Any other failure is raised (the queue redelivers)."""
    attempt = start.attempt
    try:
        if not await _write_start(rt, message, meta, start):
            return messages.ACK  # the run or step ended meanwhile
    except errors.RunExpired:
        return messages.ACK
    except errors.StepAlreadyEnded:
        await _wake(rt, message)
        return messages.ACK
    except errors.StaleStepStart as exc:
        # This delivery stalled in its start past its lease and a redelivery started
        # attempt ``latest_attempt``: that delivery owns the step now (seed 522).
        log.info(
            "run %s: step %s attempt %d's start is stale (attempt %d started); running no body",
            message.run_id,
            message.step_name,
            attempt,
            exc.latest_attempt,
        )
        return messages.ACK
    if meta.lost_lease() and max_retries != 0:
        # The lease lapsed during the start: a redelivery re-runs the step, and this body
        # could overlap it. A max_retries=0 step still runs, as an inline one does
        # (``InlineSteps.start_committed``): no other owner ever runs its body.
        log.info(
            "run %s: step %s attempt %d lost its lease while starting; running no body",
            message.run_id,
            message.step_name,
            attempt,
        )
        return messages.ACK
    return None


async def handle_step_message(
    rt: Runtime, message: messages.StepMessage, meta: messages.DeliveryMeta
) -> messages.HandlerResult:
    """One delivery of a step message; one for a run the World does not hold ends
    (acknowledged, logged at warning), never a redelivery loop (audit Bug 8, H2)."""
    try:
        return await _handle_step_message(rt, message, meta)
    except errors.RunNotFound:
        log.warning(
            "run %s: step message %s (step %s) names no run; dropping it",
            message.run_id,
            meta.message_id,
            message.step_name,
        )
        return messages.ACK


def _refusal(message: messages.StepMessage, state: _StepLog) -> str | None:
    """Why the log contradicts the message (a forged or stale one), or None."""
    creation = state.creation
    if creation is None:
        return f"the run's log created no step {message.step_id}"
    if creation.step_name != message.step_name:
        return (
            f"the run's log created step {message.step_id} as {creation.step_name!r}, "
            f"not {message.step_name!r}"
        )
    if not message.input_in_log and message.input != creation.input:
        return f"its input differs from the input the log holds for step {message.step_id}"
    return None


def _from_log(
    message: messages.StepMessage, state: _StepLog, max_retries: int
) -> messages.StepMessage:
    """The message as the log has it: its stamps, workflow and input (never the sender's)."""
    run = state.run
    assert run is not None
    return message.model_copy(
        update={
            "deployment_id": run.deployment_id,
            "run_context": messages.RunContext(
                spec_version=run.spec_version,
                deployment_id=run.deployment_id,
                workflow_name=run.workflow_name,
            ),
            "input": state.input,
            "input_in_log": True,
            "max_retries": max_retries,
        }
    )


async def _handle_step_message(
    rt: Runtime, message: messages.StepMessage, meta: messages.DeliveryMeta
) -> messages.HandlerResult:
    if message.spec_version < constants.SPEC_VERSION_SINGLE_ORCHESTRATOR and (
        rt.single_flight.running(message.run_id, message.step_id)
    ):
        # A spec 8 inline owner (or another delivery) runs this body in this process right
        # now: decide nothing (no attempt count, no exhaustion) until it settled (seed 000).
        return await _after_winner(rt, message)
    state = await _read_step_log(rt, message.run_id, message.step_id)
    refusal = _refusal(message, state)
    if refusal is not None:
        log.warning(
            "run %s: step message %s (step %s %r) refused as forged or stale: %s; "
            "nothing run or written",
            message.run_id,
            meta.message_id,
            message.step_id,
            message.step_name,
            refusal,
        )
        return messages.ACK
    assert state.creation is not None
    fn = rt.steps.get(message.step_name)
    max_retries = state.creation.max_retries
    if max_retries is None:
        max_retries = fn.max_retries if fn is not None else functions.DEFAULT_MAX_RETRIES
    message = _from_log(message, state, max_retries)
    if state.run_terminal:
        return messages.ACK  # the run ended: no body, no wake
    if state.outcome:
        await _wake(rt, message)  # its completion wake may have been lost
        return messages.ACK
    if meta.lost_lease():
        # Told its lease lapsed (it was delivered, or read the log, while its process
        # stalled): another delivery holds the message, and this one writes nothing more
        # (F3). A start written now would run no body yet spend an attempt: seed 003 fails
        # a step whose "next attempt would exceed maxRetries + 1", so two such starts
        # failed a max_retries=1 step as StepAttemptsExhausted, never run (sim seed 58).
        log.info(
            "run %s: step %s's delivery lost its lease before starting; writing nothing",
            message.run_id,
            message.step_name,
        )
        return messages.Redeliver(constants.FENCE_REFUSAL_REDELIVERY_SECONDS)  # dropped
    now = clock.utcnow()
    if state.last_type == "step_retrying" and state.retry_after and state.retry_after > now:
        return messages.Redeliver((state.retry_after - now).total_seconds())
    if steptimeouts.has_timeouts(fn) and state.last_type == "step_started":
        lapse = await steptimeouts.open_attempt_verdict(rt, fn, message, state.last_activity)
        if lapse is not None:  # its process died or stalled with the attempt open
            return await steptimeouts.end_open_attempt(
                rt, message, lapse, attempt=state.starts, max_retries=max_retries
            )
    attempt = state.starts + 1
    step_input = state.input
    if attempt > max_retries + 1:
        await _write_outcome(
            rt,
            message,
            attempt - 1,
            Outcome(
                "failed",
                error=events.ErrorInfo(
                    message=f"step {message.step_name} started {state.starts} time(s) and its "
                    f"owner died; max_retries={max_retries} allows no further attempt",
                    type="StepAttemptsExhausted",
                ),
            ),
        )
        await _wake(rt, message)
        return messages.ACK
    idle = state.last_activity is None or now - state.last_activity >= NO_ACTIVITY_BEFORE_CAP
    # The queue's own count: deliveries only a message's headers vouch for fail nothing.
    if meta.own_attempts > rt.settings.WORKFLOW_MAX_QUEUE_DELIVERIES and idle:
        await _write_outcome(
            rt,
            message,
            max(attempt - 1, 1),
            Outcome(
                "failed",
                error=(
                    events.ErrorInfo(
                        message="the step's message exceeded its deliveries",
                        type="FatalError",
                        code="MAX_DELIVERIES_EXCEEDED",
                    )
                ),
            ),
        )
        await _wake(rt, message)
        return messages.ACK
    gated = await limitgate.gate_step(rt, message, step_input)  # issue 17 item 4
    if gated is not None:
        return gated
    if message.spec_version < constants.SPEC_VERSION_SINGLE_ORCHESTRATOR:
        return await _single_flight(rt, message, meta, attempt, max_retries, step_input)
    return await _start_and_run(rt, message, meta, attempt, max_retries, step_input)


async def _single_flight(
    rt: Runtime,
    message: messages.StepMessage,
    meta: messages.DeliveryMeta,
    attempt: int,
    max_retries: int,
    step_input: JsonValue,
) -> messages.HandlerResult:
    """A spec 8 step runs under the process's single-flight (seed 000): when an inline
    owner (or another delivery) runs the body in this process, this delivery waits for
    it to settle and then runs nothing; it acknowledges once the log has the step's
    outcome, else asks for itself again (the step's only message is never spent on a
    body that did not settle)."""
    async with rt.single_flight.claim(message.run_id, message.step_id) as claim:
        if claim.won:
            return await _start_and_run(rt, message, meta, attempt, max_retries, step_input)
    return await _after_winner(rt, message)


async def _after_winner(rt: Runtime, message: messages.StepMessage) -> messages.HandlerResult:
    """The single-flight loser: wait for the running body to settle, then acknowledge
    without executing if the log has the step's outcome; else come back in a second."""
    async with rt.single_flight.claim(message.run_id, message.step_id):
        pass  # waits for a running body to settle (or takes and frees a free key)
    after = await _read_step_log(rt, message.run_id, message.step_id)
    if after.outcome or after.run_terminal:
        await _wake(rt, message)
        return messages.ACK
    return messages.Redeliver(constants.FENCE_REFUSAL_REDELIVERY_SECONDS)


async def _start_and_run(
    rt: Runtime,
    message: messages.StepMessage,
    meta: messages.DeliveryMeta,
    attempt: int,
    max_retries: int,
    step_input: JsonValue,
) -> messages.HandlerResult:
    started_at = clock.utcnow()
    start = events.StepStarted(
        correlation_id=message.step_id, step_name=message.step_name, attempt=attempt
    )

    def run_body() -> Coroutine[Any, Any, Outcome]:
        return execute(
            rt,
            run_id=message.run_id,
            workflow_name=message.run_context.workflow_name,
            step_id=message.step_id,
            step_name=message.step_name,
            input=step_input,
            attempt=attempt,
            max_retries=max_retries,
            started_at=started_at,
        )

    body: asyncio.Task[Outcome] | None = None
    # An optimistic body's stream chunks wait for its start (``streamflush.behind``).
    gate: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    if turbo.optimistic_background_start(rt.settings, message, meta, attempt, max_retries):
        body = asyncio.get_running_loop().create_task(streamflush.behind(gate, run_body()))
    try:
        refused = await _start_refused(rt, message, meta, start, max_retries)
    except asyncio.CancelledError:
        gate.set_result(False)
        if body is not None:
            body.cancel()  # the delivery itself is cancelled (its process stopping)
        raise
    except Exception:
        gate.set_result(False)
        await turbo.discard_early_body(body, message, attempt)
        raise
    gate.set_result(refused is None)
    if refused is not None:
        await turbo.discard_early_body(body, message, attempt)
        return refused
    outcome = await (body if body is not None else run_body())
    read = lambda: _read_step_log(rt, message.run_id, message.step_id)  # noqa: E731
    if steptimeouts.has_timeouts(rt.steps.get(message.step_name)) and not (
        await steptimeouts.still_latest(read, message, attempt)
    ):
        return messages.ACK  # a stuck attempt's late outcome (docs/timeouts.md)
    if not await _write_outcome(rt, message, attempt, outcome):
        return messages.ACK  # refused by the World: a later attempt started meanwhile
    await limitgate.release_step(rt, message)  # its slot, to the next waiter
    await _wake(rt, message)
    if outcome.kind == "retry":
        return messages.Redeliver(max(outcome.retry_after_seconds, 0.001))
    return messages.ACK
