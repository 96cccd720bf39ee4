"""The inline step bodies one spec 8 delivery runs (seed 000).

A body runs under the process's single-flight (``Runtime.single_flight``, keyed
``run_id:correlation_id``): a second claimant in this process (a backstop wake, a
redelivery of the owning message racing the live owner) waits for the running
body to settle and then returns without executing; its delivery reads the outcome
from the log. An owned recovery takes the claim *before* it writes its re-stamped
``step_started``, so a loser writes nothing.

A retryable failure writes ``step_retrying`` (ownership ends there for good) and
sends the step's own message with the retry's delay: the queue owns the retries.
No body is cancelled except by ``cancel`` (the delivery itself cancelled); every
other ending lets the bodies settle first (the ack invariant: no path acknowledges
the owning message while a body it owns is running).

Used by ``spec8.delivery``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from treadle import clock, errors, telemetry
from treadle.orchestrator import steps
from treadle.orchestrator.runtime import Runtime, step_key
from treadle.orchestrator.session import RunSession
from treadle.orchestrator.spec8.writes import Spec8Writes
from treadle.world import events, messages

log = logging.getLogger("treadle.orchestrator.spec8")


class Bodies:
    def __init__(
        self, rt: Runtime, session: RunSession, writes: Spec8Writes, meta: messages.DeliveryMeta
    ) -> None:
        self.rt = rt
        self.session = session
        self.writes = writes
        self.meta = meta
        self.run_id = session.run_id
        self._tasks: dict[asyncio.Task[None], str] = {}
        self.settled = asyncio.Event()
        self.owned_recoveries = 0
        # Steps whose single-flight this delivery lost: another delivery in this process
        # ran them; this one never executes them (it arms their backstop instead).
        self.absorbed: set[str] = set()

    @property
    def running(self) -> set[str]:
        return set(self._tasks.values())

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    def free_slots(self, limit: int) -> int:
        return max(limit - len(self._tasks), 0)

    # -- starting ------------------------------------------------------------------

    def start(
        self,
        step_id: str,
        step_name: str,
        step_input: Any,
        *,
        attempt: int,
        max_retries: int,
        restamp: bool = False,
    ) -> None:
        """Run one attempt; ``restamp``: an owned recovery, whose start is written here."""
        task = asyncio.get_running_loop().create_task(
            self._run(step_id, step_name, step_input, attempt, max_retries, restamp),
            name=f"treadle-spec8-inline-{step_id}",
        )
        task.add_done_callback(lambda _t: self._done())
        self._tasks[task] = step_id

    def _done(self) -> None:
        self.settled.set()
        self.session.news.set()

    async def _run(
        self,
        step_id: str,
        step_name: str,
        step_input: Any,
        attempt: int,
        max_retries: int,
        restamp: bool,
    ) -> None:
        async with self.rt.single_flight.claim(self.run_id, step_id) as claim:
            if not claim.won:
                self.absorbed.add(step_id)
                return  # the winner settled; this delivery reads its outcome from the log
            if restamp and not await self._restamp(step_id, step_name, attempt):
                return
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
            if outcome.kind != "retry":
                await self.write_outcome(event, step_name, attempt)
                return
            # The retry moves to the step's own message; ownership ends here for good.
            event = event.model_copy(update={"creator_message_id": self.meta.message_id})
            written: list[events.LoggedEvent] = []
            try:
                await self._write_retrying(event, step_name, attempt, written)
            except (errors.StepAlreadyEnded, errors.StaleStepOutcome):
                return  # another attempt's outcome won, or a later attempt started
            logged = written[0]
            retry = self.step_send(
                step_id, step_name, logged, max_retries, attempt + 1, outcome.retry_after_seconds
            )
            await self.writes.send([retry])

    async def _restamp(self, step_id: str, step_name: str, attempt: int) -> bool:
        """Owned recovery's start, stamped with this message (latest start wins)."""
        try:
            await self.writes.write(
                events.StepStarted(
                    correlation_id=step_id,
                    step_name=step_name,
                    attempt=attempt,
                    inline=True,
                    owner_message_id=self.meta.message_id,
                )
            )
        except (errors.StaleStepStart, errors.StepAlreadyEnded, errors.RunExpired) as exc:
            log.info("run %s: owned recovery of step %s not started: %s", self.run_id, step_id, exc)
            return False
        self.owned_recoveries += 1
        telemetry.add_to_current(telemetry.names.INLINE_OWNED_RECOVERY_STEPS, 1)
        log.warning(
            "run %s: owned recovery: re-running inline step %s (attempt %d) that an earlier "
            "delivery of message %s left mid-body",
            self.run_id,
            step_name,
            attempt,
            self.meta.message_id,
        )
        return True

    async def write_outcome(self, event: events.Event, step_name: str, attempt: int) -> None:
        """An outcome; the World refuses a second one (another attempt's stands), and
        one of an attempt a later start superseded (StaleStepOutcome)."""
        try:
            await self._write_retrying(event, step_name, attempt, [])
        except (errors.StepAlreadyEnded, errors.StaleStepOutcome) as exc:
            if isinstance(exc, errors.StaleStepOutcome):
                log.info("run %s: step %s outcome refused: %s", self.run_id, step_name, exc)
            await self.session.read_tail()

    async def _write_retrying(
        self,
        event: events.Event,
        step_name: str,
        attempt: int,
        written: list[events.LoggedEvent],
    ) -> None:
        """The body ran: its outcome is written again after a storage error, not left
        for a redelivery to fail as exhausted (``steps.write_outcome_retrying``)."""

        async def write() -> None:
            written.append(await self.writes.write(event))

        await steps.write_outcome_retrying(
            write,
            run_id=self.run_id,
            step_name=step_name,
            attempt=attempt,
            what=event.type,
        )

    def step_send(
        self,
        step_id: str,
        step_name: str,
        logged: events.LoggedEvent,
        max_retries: int,
        attempt: int,
        delay_seconds: float = 0.0,
    ) -> messages.Send:
        send = self.session.step_send(
            step_id,
            step_name,
            None,
            created_at=logged.created_at,
            max_retries=max_retries,
            attempt=attempt,
            delay_seconds=delay_seconds,
        )
        assert send.key == step_key(self.run_id, step_id)
        return send

    # -- settling ------------------------------------------------------------------

    def reap(self) -> None:
        """Drop settled bodies; a body's own failure (its write, say) is raised here."""
        for task in [t for t in self._tasks if t.done()]:
            del self._tasks[task]
            if not task.cancelled() and (exc := task.exception()) is not None:
                raise exc

    async def wait_any(self, timeout_s: float | None) -> None:
        """Until a body settles (or ``timeout_s``)."""
        if not self._tasks:
            return
        await asyncio.wait(
            list(self._tasks), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )

    async def settle(self, *, quiet: bool = False) -> None:
        first: BaseException | None = None
        while self._tasks:
            await asyncio.wait(list(self._tasks))
            for task in [t for t in self._tasks if t.done()]:
                del self._tasks[task]
                if not task.cancelled() and (exc := task.exception()) is not None:
                    first = first or exc
        if first is not None and not quiet:
            raise first

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()
