"""The inline step bodies one orchestrator delivery runs in its own process.

``InlineSteps`` starts a body once its ``step_started`` committed, writes its
outcome (behind the suspension's creation batches: ``creations_written``),
moves a retryable failure to the step's own message (never inline again),
re-runs or fails what a dead delivery left open (``rerun``), and lets running
bodies settle. Nothing here cancels a body except ``cancel``, which only a
cancelled delivery (its process stopping) calls: after a fence refusal, a
lost lease or any other error the bodies settle first (seed 003 "A later
batch fails", FO4). A delivery that lost its lease starts no body
(``check_lease``) and its writes are refused by the writer.

Used by ``orchestrator.delivery``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from treadle import clock, errors
from treadle.orchestrator import steps, streamflush
from treadle.orchestrator.logstate import StepState
from treadle.orchestrator.runtime import Runtime
from treadle.orchestrator.session import RunSession
from treadle.orchestrator.waits import now_ms
from treadle.orchestrator.writer import LeaseLost, Superseded
from treadle.replay import operations
from treadle.sdk import streams
from treadle.world import events, messages

if TYPE_CHECKING:
    from treadle.orchestrator.runahead import RunAhead


def check_lease(meta: messages.DeliveryMeta, run_id: str) -> None:
    """Raise ``LeaseLost`` once the queue said the delivery's lease lapsed."""
    if meta.lost_lease():
        raise LeaseLost(f"run {run_id}: the delivery lost its lease")


class InlineSteps:
    def __init__(
        self,
        rt: Runtime,
        session: RunSession,
        meta: messages.DeliveryMeta,
        last_start_ms: int,
    ) -> None:
        self.rt = rt
        self.session = session
        self.meta = meta
        self.run_id = session.run_id
        # No inline body starts from here on (the window's end less its margin).
        self.last_start_ms = last_start_ms
        self._tasks: dict[asyncio.Task[None], str] = {}
        # Clear while a suspension's creation batches are written: an inline body's
        # outcome queues on the writer only after the last of them.
        self.creations_written = asyncio.Event()
        self.creations_written.set()
        # Every step this delivery ran a body of; run-ahead, when the delivery has it.
        self.ran: set[str] = set()
        self.runahead: RunAhead | None = None
        # Stream flushes bodies left running when they returned (``flush_handoff``).
        self.deferred = streams.Deferred()

    @property
    def running(self) -> set[str]:
        """Steps with a body running here, or about to (a start written ahead)."""
        starting = self.runahead.starting if self.runahead is not None else set()
        return set(self._tasks.values()) | starting

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    def tasks_of(self, step_id: str) -> list[asyncio.Task[None]]:
        return [task for task, running in self._tasks.items() if running == step_id]

    def flush_handoff(self) -> bool:
        """A body returned with its stream still flushing and none runs: hand off (seed 003
        "Stream-flush handoff", ``streamflush``)."""
        return self.deferred.pending() and all(task.done() for task in self._tasks)

    def handoff_reason(self) -> str:
        return "a step's stream is still flushing" if self.flush_handoff() else "inline window over"

    async def flushes_landed(self) -> None:
        """Wait for the stream flushes this process still runs for the run."""
        await streamflush.wait_pending(self.run_id)

    def any_done(self) -> bool:
        return any(t.done() for t in self._tasks)

    def slots(self) -> int:
        if now_ms() >= self.last_start_ms:
            return 0
        return max(self.rt.settings.WORKFLOW_MAX_INLINE_STEPS - len(self._tasks), 0)

    # -- running bodies ------------------------------------------------------------------

    def start(
        self, step_id: str, step_name: str, step_input: Any, attempt: int, max_retries: int
    ) -> None:
        check_lease(self.meta, self.run_id)  # a delivery that lost its lease starts no body
        self._spawn(step_id, step_name, step_input, attempt, max_retries)

    def start_committed(self, call: operations.StepCall) -> None:
        """Start the body whose creating ``step_started`` just committed (attempt 1).

        If the lease was lost while that batch was being written, a retryable step is
        left to the next owner, which re-runs it (starting it here could overlap that
        re-run). A ``max_retries=0`` step is started anyway, because no other owner ever
        runs it: the next owner fails it as exhausted, and it must not fail without its
        body having run. Its outcome is not written (the writer refuses).
        """
        if self.meta.lost_lease() and call.max_retries != 0:
            return
        # Run-ahead may start it before its speculative start commits: chunks wait on that.
        barrier = None if self.runahead is None else self.runahead.start_gate(call.correlation_id)
        self._spawn(
            call.correlation_id, call.step_name, call.input, 1, call.max_retries, barrier=barrier
        )

    def start_early(self, call: operations.StepCall, started: asyncio.Future[bool]) -> None:
        """Turbo: start the body now, before its ``step_started`` commits; its outcome is
        written only if ``started`` comes True (``orchestrator.turbo``)."""
        check_lease(self.meta, self.run_id)
        self._spawn(call.correlation_id, call.step_name, call.input, 1, call.max_retries, started)

    def _spawn(
        self,
        step_id: str,
        step_name: str,
        step_input: Any,
        attempt: int,
        max_retries: int,
        started: asyncio.Future[bool] | None = None,
        *,
        barrier: asyncio.Future[bool] | None = None,
    ) -> None:
        task = asyncio.get_running_loop().create_task(
            self._run(step_id, step_name, step_input, attempt, max_retries, started, barrier),
            name=f"treadle-inline-{step_id}",
        )
        task.add_done_callback(lambda _task: self.session.news.set())
        self._tasks[task] = step_id
        self.ran.add(step_id)

    async def _run(
        self,
        step_id: str,
        step_name: str,
        step_input: Any,
        attempt: int,
        max_retries: int,
        started: asyncio.Future[bool] | None = None,
        barrier: asyncio.Future[bool] | None = None,
    ) -> None:
        # This task's own context: stream chunks wait on the start (turbo, run-ahead).
        streamflush.inline_body(self.deferred, started if barrier is None else barrier)
        outcome = await steps.execute(
            self.rt,
            run_id=self.run_id,
            workflow_name=self.session.state.workflow_name,
            step_id=step_id,
            step_name=step_name,
            input=step_input,
            attempt=attempt,
            max_retries=max_retries,
            started_at=clock.utcnow(),
            lease=self.meta,
        )
        event = steps.outcome_event(step_id, step_name, attempt, outcome)
        if started is not None and not await started:
            return  # started early, and its start never committed: the outcome is discarded
        await self.creations_written.wait()  # outcomes queue behind the creation batches
        if self.runahead is not None and await self.runahead.outcome(step_id, event, outcome.kind):
            return  # handed to the workflow ahead of its write (orchestrator.runahead)
        if outcome.kind != "retry":
            await self._write_outcome(event)
            return
        # An inline step's retry moves to the step's own message; never inline again.
        event = event.model_copy(update={"creator_message_id": self.meta.message_id})
        logged = await self.session.write(event)
        send = self.session.step_send(
            step_id,
            step_name,
            step_input,
            created_at=logged.created_at,
            max_retries=max_retries,
            attempt=attempt + 1,
            delay_seconds=outcome.retry_after_seconds,
        )
        self.session.owe(send)
        await self.session.send([send])

    def reap_done(self) -> None:
        """Drop settled bodies; a body's own failure (its write, say) is raised here."""
        for task in [t for t in self._tasks if t.done()]:
            del self._tasks[task]
            if not task.cancelled() and (exc := task.exception()) is not None:
                raise exc

    async def settle(self, *, quiet: bool = False) -> None:
        """Let running bodies finish (their writes may be refused); raise the first error
        unless ``quiet``, a supersession before any other."""
        first_error: BaseException | None = None
        while self._tasks:
            await asyncio.wait(list(self._tasks))
            for task in [t for t in self._tasks if t.done()]:
                del self._tasks[task]
                if task.cancelled() or (exc := task.exception()) is None:
                    continue
                if first_error is None or isinstance(exc, Superseded):
                    first_error = exc  # supersession wins over other failures
        if first_error is not None and not quiet:
            raise first_error

    def cancel(self) -> None:
        """Only for a delivery that is itself cancelled (its process stopping)."""
        for task in self._tasks:
            task.cancel()

    # -- what a dead delivery left open ----------------------------------------------------

    async def rerun(self, reruns: list[StepState]) -> bool:
        """Run again, or fail past its retries, what a dead delivery left.

        A step with no free inline slot waits for one while a body runs here (False: the
        caller waits for a body to settle). With no body running here no slot frees up in
        this delivery (``WORKFLOW_MAX_INLINE_STEPS=0``, or inside the deadline margin), so
        the step's retry moves to its own message, as a retryable inline failure's does,
        and it is never run inline again (bug 4: never a spin, never a hot handoff loop).

        A ``max_retries=0`` step found started is failed at once, even if its start is
        younger than a lease: the delivery that started it either wrote its outcome before
        it ended (it lets its bodies settle first, whatever its error), or cannot write
        it any more (refused by the fence, or stopped by its lost lease), so waiting would
        only delay the run by a lease for an outcome that never comes (audit F3).
        """
        progressed = False
        for step in reruns:
            attempt = step.starts + 1
            max_retries = step.max_retries
            if max_retries is None:
                fn = self.rt.steps.get(step.step_name)
                max_retries = fn.max_retries if fn is not None else 0
            if attempt > max_retries + 1:
                await self._write_outcome(
                    events.StepFailed(
                        correlation_id=step.step_id,
                        step_name=step.step_name,
                        attempt=step.starts,
                        error=events.ErrorInfo(
                            message=f"step {step.step_name} was started {step.starts} time(s) "
                            f"by a delivery that died; max_retries={max_retries} allows no more",
                            type="StepAttemptsExhausted",
                        ),
                    )
                )
                progressed = True
            elif self.slots() > 0:
                await self.session.write(
                    events.StepStarted(
                        correlation_id=step.step_id,
                        step_name=step.step_name,
                        attempt=attempt,
                        inline=True,
                    )
                )
                self.start(step.step_id, step.step_name, step.input, attempt, max_retries)
                progressed = True
            elif not self._tasks:
                await self._move_to_message(step, attempt, max_retries)
                progressed = True
        return progressed

    async def _write_outcome(self, event: events.Event) -> None:
        """An inline outcome, in-band. The World refuses a second one (StepAlreadyEnded,
        F2): another attempt's outcome won; read it from the log instead. So for an
        outcome of an attempt a later start superseded (StaleStepOutcome)."""
        try:
            await self.session.write(event)
        except (errors.StepAlreadyEnded, errors.StaleStepOutcome):
            await self.session.read_tail()

    async def _move_to_message(self, step: StepState, attempt: int, max_retries: int) -> None:
        """Hand a dead delivery's open inline step to its own message, for ``attempt``."""
        logged = await self.session.write(
            events.StepRetrying(
                correlation_id=step.step_id,
                step_name=step.step_name,
                attempt=step.starts,
                error=events.ErrorInfo(
                    message=f"step {step.step_name} was started {step.starts} time(s) by a "
                    "delivery that died, and no inline slot is free; it moves to its message",
                    type="StepAttemptLost",
                ),
                creator_message_id=self.meta.message_id,
            )
        )
        send = self.session.step_send(
            step.step_id,
            step.step_name,
            step.input,
            created_at=logged.created_at,
            max_retries=max_retries,
            attempt=attempt,
        )
        self.session.owe(send)
        await self.session.send([send])
