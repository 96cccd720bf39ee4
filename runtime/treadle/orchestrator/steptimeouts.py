"""Step timeouts and heartbeats at run time (issue 17 item 5, docs/timeouts.md).

Temporal's activity timeouts are the anchor: a start-to-close ``timeout`` bounds each
attempt, a ``heartbeat_timeout`` bounds the gap between two ``step_heartbeat()`` calls,
and an attempt past either fails with ``StepTimedOut``, retried per ``max_retries``.

Where each rule holds:

- In the attempt's own process (``run_body``, inline and background alike, spec 8 and 9:
  every body runs through ``steps.execute``): an async body is cancelled at the deadline
  or the lapse; a sync body in a thread cannot be killed, so the attempt stops waiting for
  it and whatever it returns later is dropped. A body that returns (or raises) after its
  deadline or lapse (its process was stuck: a blocked loop, a stopped process) has its
  outcome refused: the attempt's outcome is the timeout, whatever the body said.
- Before a background attempt's outcome is written (``superseded``): the step's log is
  read again, and an attempt a later one replaced (its process was stuck past its lease,
  and a redelivery started the next attempt) writes nothing. An inline attempt's outcome
  is written in-band, where the fence already refuses a stale delivery.
- On a redelivery finding an attempt started and never ended (its process died, or
  stalled past its lease: ``open_attempt_verdict``): a step with a heartbeat timeout waits
  for the lapse (the later of the stored beat and the attempt's start, plus the timeout)
  and then records the attempt as ``step_retrying`` (or ``step_failed`` on the last) with
  ``StepTimedOut``; a step past its start-to-close deadline likewise. The next attempt
  reads the last stored details (``previous_details``).

Heartbeats are cheap: a beat only updates the attempt's ``Beats``; the runner stores the
latest details (``world.heartbeats``, one row per step, never the log) at most once per
``min(WORKFLOW_STEP_HEARTBEAT_THROTTLE_SECONDS, 0.8 x heartbeat_timeout)``, and once more
when the attempt fails with beats not yet stored. Only steps that declare a
``heartbeat_timeout`` store beats, and only steps that declare a timeout pay any of this.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeGuard

from treadle import clock, errors, serde
from treadle.orchestrator.runtime import Runtime
from treadle.sdk import context, functions
from treadle.sdk.heartbeats import BEATS, Beats
from treadle.world import contract, events, messages

log = logging.getLogger("treadle.orchestrator.steptimeouts")

# How long a cancelled async body may take to unwind before the attempt stops waiting.
CANCEL_GRACE_SECONDS = 5.0
# A stored beat's share of the heartbeat timeout (Temporal throttles at 80 %).
THROTTLE_SHARE = 0.8


def has_timeouts(
    fn: functions.StepFunction[Any, Any] | None,
) -> TypeGuard[functions.StepFunction[Any, Any]]:
    return fn is not None and (fn.timeout is not None or fn.heartbeat_timeout is not None)


def throttle_seconds(rt: Runtime, fn: functions.StepFunction[Any, Any]) -> float:
    throttle = rt.settings.WORKFLOW_STEP_HEARTBEAT_THROTTLE_SECONDS
    if fn.heartbeat_timeout is not None:
        throttle = min(throttle, THROTTLE_SHARE * fn.heartbeat_timeout)
    return throttle


async def previous_details(
    rt: Runtime, fn: functions.StepFunction[Any, Any], run_id: str, step_id: str, attempt: int
) -> Any:
    """The details of the last beat an earlier attempt stored, decoded; None if none."""
    store = contract.heartbeats_of(rt.world)
    if attempt <= 1 or fn.heartbeat_timeout is None or store is None:
        return None
    try:
        held = await store.get(run_id, step_id)
    except errors.StorageUnavailable as exc:
        log.warning("run %s: step %s heartbeat details unreadable (%s)", run_id, fn.name, exc)
        return None
    if held is None or held.attempt >= attempt:
        return None
    try:
        return serde.decode(held.details, f"step {fn.name} heartbeat details")
    except errors.SerializationError as exc:
        log.warning("run %s: step %s heartbeat details not decoded (%s)", run_id, fn.name, exc)
        return None


class _Flusher:
    """Stores an attempt's latest beat, at most once per throttle interval."""

    def __init__(
        self,
        store: contract.Heartbeats,
        meta: context.StepMetadata,
        beats_of: list[Beats],
        throttle: float,
    ) -> None:
        self.store = store
        self.meta = meta
        self._beats_of = beats_of
        self.throttle = throttle
        self.wake = asyncio.Event()
        self.stored = 0  # the beat count last stored
        self.task: asyncio.Task[None] | None = None

    async def _store(self) -> None:
        _, details, count = self._beats_of[0].latest()
        if count == self.stored:
            return
        self.stored = count
        write = asyncio.ensure_future(
            self.store.record(
                self.meta.run_id,
                self.meta.step_id,
                attempt=self.meta.attempt,
                details=details,
                beat_at=clock.utcnow(),
            )
        )
        write.add_done_callback(_retrieve)
        try:
            await asyncio.shield(write)  # the attempt ending never cuts a write short
        except errors.StorageUnavailable as exc:
            log.warning(
                "run %s: step %s attempt %d: a heartbeat was not stored (%s)",
                self.meta.run_id,
                self.meta.step_name,
                self.meta.attempt,
                exc,
            )

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            await self._store()
            await asyncio.sleep(self.throttle)

    async def final(self) -> None:
        """The attempt failed: store beats not stored yet (the next attempt's details)."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.wait([self.task])
        await self._store()


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # an abandoned body's late failure: never "never retrieved"


async def run_body(
    rt: Runtime,
    fn: functions.StepFunction[Any, Any],
    args: list[Any],
    kwargs: dict[str, Any],
    meta: context.StepMetadata,
) -> Any:
    """Run one attempt's body under its timeouts; ``StepTimedOut`` past either."""
    details = await previous_details(rt, fn, meta.run_id, meta.step_id, meta.attempt)
    meta = dataclasses.replace(meta, heartbeat_details=details)
    loop = asyncio.get_running_loop()
    store = contract.heartbeats_of(rt.world) if fn.heartbeat_timeout is not None else None
    beats_of: list[Beats] = []
    flusher = None
    if store is not None:
        flusher = _Flusher(store, meta, beats_of, throttle_seconds(rt, fn))
        beats = Beats(loop, flusher.wake.set)
    else:
        beats = Beats(loop, lambda: None)
    beats_of.append(beats)
    token, step_token = BEATS.set(beats), context.STEP.set(meta)
    try:  # the body's task copies both
        body = loop.create_task(fn.run_body(args, kwargs), name=f"treadle-step-{meta.step_id}")
    finally:
        context.STEP.reset(step_token)
        BEATS.reset(token)
    body.add_done_callback(_retrieve)
    if flusher is not None:
        flusher.task = loop.create_task(flusher.run())
    ok = False
    try:
        try:
            await _watch(fn, meta, beats, body)
        except asyncio.CancelledError:
            ok = True  # the process is stopping: no final store
            raise
        lapse = _lapsed(fn, meta, beats)
        if lapse is not None:
            log.info(
                "run %s: step %s attempt %d ended after its %s; its outcome is refused",
                meta.run_id,
                fn.name,
                meta.attempt,
                "heartbeat lapse" if lapse.heartbeat else "timeout",
            )
            raise lapse
        value = body.result()
        ok = True
        return value
    finally:
        if flusher is not None:
            if ok:
                assert flusher.task is not None
                flusher.task.cancel()
            else:
                await flusher.final()


async def _watch(
    fn: functions.StepFunction[Any, Any],
    meta: context.StepMetadata,
    beats: Beats,
    body: asyncio.Task[Any],
) -> None:
    """Until the body ends; at the deadline or a lapse, cancel it and raise."""
    try:
        while not body.done():
            lapse = _lapsed(fn, meta, beats)
            if lapse is not None:
                body.cancel()
                await asyncio.wait([body], timeout=CANCEL_GRACE_SECONDS)
                if not body.done():
                    log.warning(
                        "run %s: step %s attempt %d did not stop when cancelled; left running",
                        meta.run_id,
                        fn.name,
                        meta.attempt,
                    )
                raise lapse
            await asyncio.wait([body], timeout=_until_next_check(fn, meta, beats))
    except asyncio.CancelledError:
        body.cancel()  # the attempt itself is cancelled (its process stopping)
        raise


def _until_next_check(
    fn: functions.StepFunction[Any, Any], meta: context.StepMetadata, beats: Beats
) -> float:
    now = clock.now()
    ends = []
    if fn.timeout is not None:
        ends.append(meta.started_at.timestamp() + fn.timeout)
    if fn.heartbeat_timeout is not None:
        ends.append(beats.latest()[0] + fn.heartbeat_timeout)
    return max(min(ends) - now, 0.0) + 0.001


def _lapsed(
    fn: functions.StepFunction[Any, Any], meta: context.StepMetadata, beats: Beats
) -> errors.StepTimedOut | None:
    now = clock.now()
    if fn.timeout is not None and now >= meta.started_at.timestamp() + fn.timeout:
        return errors.StepTimedOut(fn.name, seconds=fn.timeout)
    if fn.heartbeat_timeout is not None and now >= beats.latest()[0] + fn.heartbeat_timeout:
        return errors.StepTimedOut(fn.name, seconds=fn.heartbeat_timeout, heartbeat=True)
    return None


@dataclass(frozen=True)
class OpenAttempt:
    """What a redelivery does with an attempt started and never ended."""

    wait_seconds: float = 0.0  # > 0: not lapsed yet; ask for the message again then
    error: errors.StepTimedOut | None = None  # lapsed: record the attempt as failed by it


async def open_attempt_verdict(
    rt: Runtime,
    fn: functions.StepFunction[Any, Any],
    message: messages.StepMessage,
    started: datetime | None,
) -> OpenAttempt | None:
    """Judge the step's latest attempt, started at ``started`` (its step_started's time)
    and never ended, its process gone: None keeps the engine's usual rule (the next
    attempt starts at once)."""
    run_id, step_id = message.run_id, message.step_id
    now = clock.now()
    started_at = started or clock.utcnow()
    if fn.heartbeat_timeout is not None:
        last = started_at.timestamp()
        store = contract.heartbeats_of(rt.world)
        if store is not None:
            held = await store.get(run_id, step_id)
            if held is not None:
                last = max(last, held.beat_at.timestamp())
        lapse_at = last + fn.heartbeat_timeout
        if fn.timeout is not None:
            lapse_at = min(lapse_at, started_at.timestamp() + fn.timeout)
        if now < lapse_at:
            return OpenAttempt(wait_seconds=lapse_at - now)
        heartbeat = fn.timeout is None or lapse_at < started_at.timestamp() + fn.timeout
        seconds = fn.heartbeat_timeout if heartbeat else fn.timeout
        assert seconds is not None
        lapse = errors.StepTimedOut(fn.name, seconds=seconds, heartbeat=heartbeat)
        return OpenAttempt(error=lapse)
    if fn.timeout is not None and now >= started_at.timestamp() + fn.timeout:
        return OpenAttempt(error=errors.StepTimedOut(fn.name, seconds=fn.timeout))
    return None


def _error(exc: errors.StepTimedOut) -> events.ErrorInfo:
    return events.ErrorInfo(message=str(exc), type=type(exc).__name__)


async def end_open_attempt(
    rt: Runtime,
    message: messages.StepMessage,
    verdict: OpenAttempt,
    *,
    attempt: int,
    max_retries: int,
) -> messages.HandlerResult:
    """A redelivery's answer for an open attempt judged by ``open_attempt_verdict``: the
    message again once the lapse is due, or the attempt recorded as timed out
    (``step_retrying``, or ``step_failed`` past ``max_retries``) and the run woken."""
    if verdict.error is None:
        return messages.Redeliver(max(verdict.wait_seconds, 0.001))
    delay = rt.settings.WORKFLOW_STEP_RETRY_DELAY_SECONDS
    retry = attempt <= max_retries
    event: events.Event
    if retry:
        event = events.StepRetrying(
            correlation_id=message.step_id,
            step_name=message.step_name,
            attempt=attempt,
            error=_error(verdict.error),
            retry_after=clock.utcnow() + timedelta(seconds=delay),
        )
    else:
        event = events.StepFailed(
            correlation_id=message.step_id,
            step_name=message.step_name,
            attempt=attempt,
            error=_error(verdict.error),
        )
    log.info(
        "run %s: step %s attempt %d lapsed in a process that is gone (%s); %s",
        message.run_id,
        message.step_name,
        attempt,
        verdict.error,
        "retrying" if retry else "failing the step",
    )
    try:
        await rt.world.events.create(message.run_id, event, in_band=False)
    except (
        errors.StepAlreadyEnded,
        errors.RunExpired,
        errors.StaleStepStart,
        errors.StaleStepOutcome,
    ):
        return messages.ACK  # it ended meanwhile (its outcome, the run's end, a later start)
    wake = rt.wake_message(
        message.run_id, message.deployment_id, spec_version=message.run_context.spec_version
    )
    await rt.world.queue.send(wake)
    return messages.Redeliver(max(delay, 0.001)) if retry else messages.ACK


class _StepView(Protocol):
    last_type: str
    starts: int


async def still_latest(
    read: Callable[[], Awaitable[_StepView]], message: messages.StepMessage, attempt: int
) -> bool:
    """Before a background attempt of a step with timeouts writes its outcome: False
    when the step's log shows the attempt ended or replaced (its process was stuck past
    its lease, and a redelivery recorded its lapse or started the next attempt); its
    outcome is then dropped, never written."""
    state = await read()
    if state.last_type == "step_started" and state.starts == attempt:
        return True
    log.info(
        "run %s: step %s attempt %d finished after the step's log moved on (latest "
        "attempt %d, last %s); its outcome is dropped",
        message.run_id,
        message.step_name,
        attempt,
        state.starts,
        state.last_type,
    )
    return False
