"""One orchestrator delivery of a spec 8 run (seed 000; seed 003 "Spec 8 and spec 9
side by side", "Sleeps and timers, spec 8 against spec 9").

Spec 8 is the multi-writer format: a run's deliveries are not serialized, so a hook
resume or a timer wakes the run in a delivery of its own while another delivery
still runs an inline step's body. Each delivery:

1. reads the run row: a spec 9 run is handed to its orchestrator
   (``specrouting.hand_off``), another deployment's run is re-routed, an ended run
   acknowledged; past ``WORKFLOW_MAX_QUEUE_DELIVERIES`` the run fails;
2. loads the log, writes ``run_started`` once (a second is refused by the World);
3. in every pass: completes every open wait that is due (out-of-band
   ``wait_completed``; the World refuses a second one), replays, and at a
   suspension writes what the workflow waits on: hooks, waits, new steps (inline
   ones by their lazy ``step_started``, stamped with this message's id as the
   owner; eager ones by ``step_created`` and their keyed step message), then walks
   seed 000's decision table for every created, unsettled step
   (``spec8.dispatch``), and sends one continuation for the earliest open wait
   (``spec8.timers``);
4. waits for its inline bodies (``spec8.bodies``, under the process's
   single-flight) and replays again after each outcome; once nothing is left that it
   can drive, it acknowledges, after every body settled and only if no step this
   message owns is left unsettled (seed 000's ack invariant, guarded by an
   error-level log and a redelivery).

Every write is out-of-band; a creation another writer made first is refused by the
World (``EntityAlreadyCreated``, ``StaleStepStart``) and read from the log instead.
Every message sent is stamped with the run's version. No inline step starts after
the inline window (``WORKFLOW_V2_TIMEOUT_MS`` less its margin) or while an open wait
comes due within it plus ``WORKFLOW_OPEN_WAIT_CLOCK_SKEW_MS``: those steps are queued.

Called by the worker for every orchestrator message routed to spec 8.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from treadle import errors, serde, telemetry
from treadle.orchestrator import decisions, divergence, hookwrites, pinning, specrouting, steps
from treadle.orchestrator.runtime import Runtime
from treadle.orchestrator.session import RunSession
from treadle.orchestrator.spec8 import dispatch, ownership
from treadle.orchestrator.spec8 import timers as spec8_timers
from treadle.orchestrator.spec8.bodies import Bodies
from treadle.orchestrator.spec8.writes import Spec8Writes
from treadle.orchestrator.waits import ms, now_ms
from treadle.orchestrator.writer import LeaseLost
from treadle.replay import engine, operations
from treadle.sdk import functions
from treadle.settings import Settings
from treadle.world import constants, events, messages

log = logging.getLogger("treadle.orchestrator.spec8")

# Refusals meaning "another writer created this first": read it from the log.
_LOST_RACE = (errors.EntityAlreadyCreated, errors.StaleStepStart, errors.EarlierItemRefused)


async def deliver(
    rt: Runtime, message: messages.OrchestratorMessage, meta: messages.DeliveryMeta
) -> messages.HandlerResult:
    """Drive a spec 8 run for one delivery of ``message``."""
    return await Spec8Delivery(rt, message, meta).run()


def max_inline_steps(settings: Settings) -> int:
    """``WORKFLOW_MAX_INLINE_STEPS``; on spec 8 runs 0 is read as unset (seed 003)."""
    value = settings.WORKFLOW_MAX_INLINE_STEPS
    if value == 0:
        default = Settings.model_fields["WORKFLOW_MAX_INLINE_STEPS"].default
        assert isinstance(default, int)
        return default
    return value


class Spec8Delivery:
    def __init__(
        self, rt: Runtime, message: messages.OrchestratorMessage, meta: messages.DeliveryMeta
    ) -> None:
        self.rt = rt
        self.settings = rt.settings
        self.message = message
        self.meta = meta
        self.run_id = message.run_id
        self.session = RunSession(rt, self.run_id, meta.lease_lost)
        self.writes = Spec8Writes(self.session, meta)
        self.bodies = Bodies(rt, self.session, self.writes, meta)
        self.deadline_ms = meta.invocation_started_at + self.settings.WORKFLOW_V2_TIMEOUT_MS
        margin = self.settings.WORKFLOW_INLINE_STEP_DEADLINE_MARGIN_MS
        self.last_start_ms = self.deadline_ms - margin
        self.table = dispatch.Table(
            my_message_id=meta.message_id,
            lease_seconds=ownership.clamp_lease(
                self.settings.WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS
            ),
            enabled=self.settings.WORKFLOW_INLINE_OWNERSHIP,
        )
        self._divergences = 0
        self._workflow: functions.WorkflowFunction[Any, Any] | None = None

    @property
    def replay(self) -> engine.Replay:
        assert self.session.replay is not None
        return self.session.replay

    # -- entry -------------------------------------------------------------------------

    async def run(self) -> messages.HandlerResult:
        try:
            return await self._run()
        except errors.RunExpired:
            await self.bodies.settle(quiet=True)
            return messages.ACK  # the run ended under us (a cancel, say)
        except LeaseLost:
            await self.bodies.settle(quiet=True)
            log.warning(
                "run %s: spec 8 delivery of %s lost its lease; stopped writing",
                self.run_id,
                self.meta.message_id,
            )
            return messages.Redeliver(constants.FENCE_REFUSAL_REDELIVERY_SECONDS)  # dropped
        except Exception:
            # No body is cut off mid side effect: they settle before the delivery fails.
            await self.bodies.settle(quiet=True)
            raise
        finally:
            self.bodies.cancel()  # only a cancelled delivery (its process stopping) has any
            self.session.close()

    async def _run(self) -> messages.HandlerResult:
        try:
            record = await self.rt.world.runs.get(self.run_id)
        except errors.RunNotFound:
            log.warning("run %s: message %s names no run", self.run_id, self.meta.message_id)
            return messages.ACK
        if record.spec_version >= constants.SPEC_VERSION_SINGLE_ORCHESTRATOR:
            return await specrouting.hand_off(self.rt, self.message, record.spec_version)
        if record.spec_version not in constants.SUPPORTED_SPEC_VERSIONS | {
            constants.SPEC_VERSION_LEGACY
        }:
            log.error(
                "run %s: spec version %s is not supported by this worker; leaving it",
                self.run_id,
                record.spec_version,
            )
            return messages.Redeliver(constants.MAX_REDELIVER_SECONDS)
        if record.deployment_id != self.rt.deployment_id:
            return await pinning.reroute(self.rt, self.message, record.deployment_id)
        if record.is_terminal:
            return messages.ACK
        cap = self.settings.WORKFLOW_MAX_QUEUE_DELIVERIES
        if self.meta.own_attempts > cap:
            await self._write_terminal(
                events.RunFailed(
                    error=events.ErrorInfo(
                        message=f"the run's orchestrator message was delivered "
                        f"{self.meta.attempt} times (WORKFLOW_MAX_QUEUE_DELIVERIES={cap})",
                        type="FatalError",
                        code="MAX_DELIVERIES_EXCEEDED",
                    )
                )
            )
            return messages.ACK
        workflow = self.rt.workflows.get(record.workflow_name)
        if workflow is None:
            await self._write_terminal(
                events.RunFailed(
                    error=events.ErrorInfo(
                        message=f"no workflow named {record.workflow_name!r} is registered in "
                        f"deployment {self.rt.deployment_id}",
                        type="WorkflowNotFound",
                    )
                )
            )
            return messages.ACK
        self._workflow = workflow
        telemetry.describe_run(record.workflow_name, record.spec_version)
        await self.session.load()
        if self.session.state.terminal is not None:
            return messages.ACK
        self.session.start_replay(workflow)
        if not self.session.state.started:
            with contextlib.suppress(*_LOST_RACE):
                await self.writes.write(events.RunStarted())
        return await self._passes()

    # -- the passes ----------------------------------------------------------------------

    async def _passes(self) -> messages.HandlerResult:
        while True:
            self.writes.check_lease()
            self.bodies.reap()
            await self._complete_elapsed_waits()
            outcome = self.replay.advance()
            match outcome:
                case engine.Ended():
                    return await self._finish()
                case engine.Completed(value=value):
                    await self.bodies.settle()
                    name = self.session.state.workflow_name
                    try:
                        output = serde.encode(value, f"workflow {name} output")
                    except errors.SerializationError as exc:
                        await self._write_terminal(events.RunFailed(error=steps.error_info(exc)))
                    else:
                        await self._write_terminal(events.RunCompleted(output=output))
                    return await self._finish()
                case engine.Failed(error=error):
                    await self.bodies.settle()
                    await self._write_terminal(events.RunFailed(error=steps.error_info(error)))
                    return await self._finish()
                case engine.Diverged() as diverged:
                    if not await self._recover_divergence(diverged):
                        return await self._finish()
                case engine.Suspended() as suspended:
                    if await self._suspended(suspended):
                        continue
                    if self.bodies.busy:
                        await self._wait_for_a_body()
                        await self.session.read_tail()
                        continue
                    if await self.session.read_tail():
                        continue  # another writer's events: decide on them first
                    await self._arm_timers()
                    return await self._finish()

    async def _write_terminal(self, event: events.Event) -> None:
        with contextlib.suppress(errors.RunExpired):
            await self.writes.write(event)

    async def _finish(self) -> messages.HandlerResult:
        """Acknowledge, once every body settled and no step this message owns is open."""
        await self.bodies.settle()
        await self.session.read_tail()
        state = self.session.state
        if state.terminal is None:
            left = self.table.owned_open(state, self.session.loaded, absorbed=self.bodies.absorbed)
            if left:
                log.error(
                    "run %s: invariant: delivery of %s would acknowledge its message while it "
                    "owns unsettled inline steps %s; redelivering it instead (owned recovery)",
                    self.run_id,
                    self.meta.message_id,
                    left,
                )
                return messages.Redeliver(constants.FENCE_REFUSAL_REDELIVERY_SECONDS)
        return messages.ACK

    async def _wait_for_a_body(self) -> None:
        """Until a running body settles or the queue says the lease lapsed."""
        waiters: list[asyncio.Future[Any]] = []
        lease_lost = self.meta.lease_lost
        if lease_lost is not None:
            waiters.append(asyncio.ensure_future(lease_lost.wait()))
        try:
            self.bodies.settled.clear()
            if self.bodies.busy:
                waiters.append(asyncio.ensure_future(self.bodies.settled.wait()))
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def _recover_divergence(self, diverged: engine.Diverged) -> bool:
        """Replay cold in place; False once the budget is spent and the run failed."""
        self._divergences += 1
        budget = self.settings.WORKFLOW_REPLAY_DIVERGENCE_MAX_RETRIES
        spent = divergence.over_budget(log, self.run_id, diverged, self._divergences, budget)
        await self.bodies.settle()
        if spent:
            await self._write_terminal(divergence.corrupted(self.run_id, diverged))
            return False
        assert self._workflow is not None
        await self.session.load()
        self.session.start_replay(self._workflow)
        return True

    # -- waits -----------------------------------------------------------------------------

    async def _complete_elapsed_waits(self) -> None:
        """Seed 003's "complete elapsed waits" pass: any delivery may complete a due wait."""
        due = decisions.due_waits(self.session.state, now_ms=now_ms(), woken=set())
        for wait in due:
            try:
                await self.writes.write(events.WaitCompleted(correlation_id=wait.wait_id))
            except errors.WaitAlreadyCompleted:
                await self.session.read_tail()

    def _timer_send(
        self, wait_id: str, resume_at_ms: int, early: tuple[int, str] | None = None
    ) -> messages.Send:
        state = self.session.state
        return spec8_timers.continuation(
            run_id=self.run_id,
            deployment_id=state.deployment_id,
            spec_version=state.spec_version,
            wait=spec8_timers.Timer(wait_id, resume_at_ms),
            now_ms=now_ms(),
            max_hop_ms=int(self.settings.WORKFLOW_WAIT_CONTINUATION_MAX_DELAY_SECONDS * 1000),
            near_elapsed_ms=int(self.settings.WORKFLOW_NEAR_ELAPSED_WAIT_THRESHOLD_SECONDS * 1000),
            early=early,
        )

    async def _arm_timers(self) -> None:
        """One continuation for the earliest open wait; and, when this delivery is a timer
        that came before its wait was due, that wait's own re-arm (or it would be lost)."""
        state = self.session.state
        waits = sorted(state.open_waits(), key=lambda w: (w.resume_at, w.slot))
        if not waits:
            return
        sends = [self._timer_send(waits[0].wait_id, ms(waits[0].resume_at))]
        cont = self.message.wait_continuation
        if cont is not None and cont.correlation_id in state.open_wait_ids:
            wait = state.waits[cont.correlation_id]
            remaining = ms(wait.resume_at) - now_ms()
            max_hop = int(self.settings.WORKFLOW_WAIT_CONTINUATION_MAX_DELAY_SECONDS * 1000)
            if 0 < remaining <= max_hop:
                early = (self.meta.attempt, self.meta.message_id)
                sends.append(self._timer_send(wait.wait_id, ms(wait.resume_at), early))
        await self.writes.send(sends)

    # -- a suspension -------------------------------------------------------------------

    async def _suspended(self, suspended: engine.Suspended) -> bool:
        """Write what the workflow waits on and dispatch the unsettled steps; True when
        something was written (another pass decides on it)."""
        wrote = False
        if suspended.dispose or any(isinstance(o, operations.HookWait) for o in suspended.new):
            try:
                conflicts = await hookwrites.write_hooks(self.writes, suspended)
            except _LOST_RACE:
                # Another delivery created the hook first (with its own minted token, if
                # none was chosen): replay afresh so the code takes the log's.
                await self.session.read_tail()
                assert self._workflow is not None
                self.session.start_replay(self._workflow)
                return True
            wrote = True
            if conflicts:
                # The pass decided before its conflict existed: replay afresh, so
                # conflict() answers at creation as every later replay will.
                assert self._workflow is not None
                self.session.start_replay(self._workflow)
                return True
        if await self._create(suspended):
            wrote = True
        if await self._dispatch_unsettled():
            wrote = True
        await self._arm_timers()
        return wrote

    def _inline_slots(self, new_waits: list[operations.Sleep]) -> int:
        """Inline bodies this suspension may start: none past the window, none while a wait
        comes due within it (plus the clock-skew allowance)."""
        now = now_ms()
        if now >= self.last_start_ms:
            return 0
        due = [ms(w.resume_at) for w in self.session.state.open_waits()]
        due += [ms(w.resume_at) for w in new_waits]
        if due and min(due) <= self.deadline_ms + self.settings.WORKFLOW_OPEN_WAIT_CLOCK_SKEW_MS:
            return 0
        return self.bodies.free_slots(max_inline_steps(self.settings))

    async def _create(self, suspended: engine.Suspended) -> bool:
        waits = [op for op in suspended.new if isinstance(op, operations.Sleep)]
        calls = [op for op in suspended.new if isinstance(op, operations.StepCall)]
        if not waits and not calls:
            return False
        inline = [c for c in calls if c.may_run_inline][: self._inline_slots(waits)]
        me = self.meta.message_id
        batch: list[events.Event] = []
        for call in calls:
            for event in decisions.step_creation(
                call, inline=call in inline, creator_message_id=me
            ):
                if isinstance(event, events.StepStarted):
                    event = event.model_copy(update={"owner_message_id": me})
                batch.append(event)
        for wait in waits:
            batch.append(
                events.WaitCreated(
                    correlation_id=wait.correlation_id,
                    resume_at=wait.resume_at,
                    creator_message_id=me,
                    position=wait.position,
                )
            )
        starts = {call.correlation_id: call for call in inline}
        for chunk in decisions.creation_batches(batch):
            committed, refused = await self.writes.write_batch(chunk)
            sends = []
            for logged in committed:
                event = logged.event
                begun = starts.get(event.correlation_id or "")
                if isinstance(event, events.StepStarted) and event.inline and begun is not None:
                    self.bodies.start(
                        begun.correlation_id,
                        begun.step_name,
                        begun.input,
                        attempt=1,
                        max_retries=begun.max_retries,
                    )
                elif isinstance(event, events.StepCreated) and not event.inline:
                    sends.append(
                        self.session.step_send(
                            event.correlation_id,
                            event.step_name,
                            None,
                            created_at=logged.created_at,
                            max_retries=event.max_retries,
                        )
                    )
            await self.writes.send(sends)
            lost = [r for r in refused if isinstance(r, _LOST_RACE)]
            if len(lost) != len(refused):
                raise next(r for r in refused if not isinstance(r, _LOST_RACE))
            if lost:
                log.info(
                    "run %s: %d creations were made first by another delivery: %s",
                    self.run_id,
                    len(lost),
                    lost[0],
                )
                await self.session.read_tail()
        return True

    async def _dispatch_unsettled(self) -> bool:
        """Seed 000's decision table for every created, unsettled step not running here."""
        plan = self.table.plan(
            self.session.state,
            self.session.loaded,
            running=self.bodies.running,
            absorbed=self.bodies.absorbed,
        )
        wrote = False
        sends: list[messages.Send] = []
        slots = 0 if now_ms() >= self.last_start_ms else None
        for item in plan:
            step = item.step
            if item.action is ownership.Action.EXECUTE:
                max_retries = self._max_retries(step.step_name, step.max_retries)
                attempt = step.starts + 1
                if attempt > max_retries + 1:
                    await self.bodies.write_outcome(
                        dispatch.exhausted(step, max_retries, self.meta.message_id),
                        step.step_name,
                        attempt - 1,
                    )
                    wrote = True
                    continue
                free = (
                    self.bodies.free_slots(max_inline_steps(self.settings)) if slots is None else 0
                )
                if free > 0:
                    self.bodies.start(
                        step.step_id,
                        step.step_name,
                        step.input,
                        attempt=attempt,
                        max_retries=max_retries,
                        restamp=True,
                    )
                    wrote = True
                    continue
                self.table.handed_off.add(step.step_id)  # no slot: its message runs it
                sends.append(self._step_send(step, attempt, max_retries))
            elif item.action is ownership.Action.BACKSTOP:
                assert item.key is not None
                sends.append(self._backstop(item.key, item.delay_seconds))
                log.debug(
                    "run %s: step %s is owned by another delivery; backstop wake in %.1f s (%s)",
                    self.run_id,
                    step.step_id,
                    item.delay_seconds,
                    item.key,
                )
            else:
                max_retries = self._max_retries(step.step_name, step.max_retries)
                sends.append(self._step_send(step, step.starts + 1, max_retries))
        await self.writes.send(sends)
        return wrote

    def _max_retries(self, step_name: str, recorded: int | None) -> int:
        if recorded is not None:
            return recorded
        fn = self.rt.steps.get(step_name)
        return fn.max_retries if fn is not None else functions.DEFAULT_MAX_RETRIES

    def _step_send(self, step: Any, attempt: int, max_retries: int) -> messages.Send:
        return self.session.step_send(
            step.step_id,
            step.step_name,
            None,
            created_at=step.created_at,
            max_retries=max_retries,
            attempt=attempt,
            resent=step.starts > 0,
        )

    def _backstop(self, key: str, delay_seconds: float) -> messages.Send:
        """A plain run continuation, delayed by the lease remainder (seed 000)."""
        self.table.backstops_armed += 1
        telemetry.add_to_current(telemetry.names.INLINE_BACKSTOP_WAKES_ARMED, 1)
        state = self.session.state
        message = messages.OrchestratorMessage(
            run_id=self.run_id,
            deployment_id=state.deployment_id,
            run_spec_version=state.spec_version,
        )
        return messages.Send(message, key, delay_seconds)
