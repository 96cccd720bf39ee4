"""One orchestrator delivery of a spec 9 run (seed 003 "One delivery's main loop").

``OrchestratorDelivery.run`` loads the log (turbo skips it on the start message's
first delivery), replays the workflow, and at each suspension writes its decisions
through the in-band writer, sends what the writes owe and runs inline steps. An
outcome is consumed after its write committed, except where run-ahead hands it to the
replay first (``runahead``, docs/run-ahead.md) and turbo starts a first boundary's
bodies early (``turbo``, docs/turbo.md). It answers ``Ack`` when the run ended or
waits on nothing it can drive, ``Redeliver(1)`` after a fence refusal, ``Handoff`` at
the end of its inline window. No error cancels a running body: after a refusal, a
lost lease (the writer then refuses, no body starts) or any other failure, no pass
decides any more, the bodies settle, and only then does the delivery answer or fail
(seed 003 "A later batch fails", FO4).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from treadle import clock, errors, serde, telemetry
from treadle.orchestrator import children as family
from treadle.orchestrator import compat, decisions, divergence, hookwrites, pinning, polling, steps
from treadle.orchestrator import specrouting as by_spec
from treadle.orchestrator.inline import InlineSteps, check_lease
from treadle.orchestrator.runahead import RunAhead, RunAheadRestartsSpent
from treadle.orchestrator.runtime import Runtime
from treadle.orchestrator.session import RunSession
from treadle.orchestrator.turbo import OptimisticStarts, turbo_start_from_record
from treadle.orchestrator.waits import WaitArmer, ms, now_ms
from treadle.orchestrator.writer import LeaseLost, Superseded
from treadle.replay import engine, operations
from treadle.world import constants, events, messages, specversions

log = logging.getLogger("treadle.orchestrator.delivery")


def _retrieve(done: asyncio.Future[Any]) -> None:
    """A write in flight that nobody awaits: its failure stops the writer, which every
    later write reports; reading it here keeps asyncio from logging it as lost."""
    if not done.cancelled():
        done.exception()


class OrchestratorDelivery:
    def __init__(
        self, rt: Runtime, message: messages.OrchestratorMessage, meta: messages.DeliveryMeta
    ) -> None:
        self.rt = rt
        self.settings = rt.settings
        self.message = message
        self.meta = meta
        self.run_id = message.run_id
        self.deadline_ms = meta.invocation_started_at + self.settings.WORKFLOW_V2_TIMEOUT_MS
        self.margin_ms = self.settings.WORKFLOW_INLINE_STEP_DEADLINE_MARGIN_MS
        self.session = RunSession(rt, self.run_id, meta.lease_lost)
        self.inline = InlineSteps(rt, self.session, meta, self.deadline_ms - self.margin_ms)
        self.waits = WaitArmer(rt, self.session, message, meta)
        self.ahead = RunAhead(rt, self.session, self.inline, meta, self.deadline_ms)
        self._polls = polling.PollSchedule(
            poll_ms=self.settings.WORKFLOW_ORCHESTRATOR_POLL_INTERVAL_MS,
            feed_poll_ms=self.settings.WORKFLOW_ORCHESTRATOR_FEED_POLL_INTERVAL_MS,
        )
        self._divergences = 0
        self._hook_conflicts = hookwrites.ConflictContinuations(self.run_id)
        # Turbo (a start's first delivery): run_started is not awaited; later writes queue behind.
        self._turbo = False
        self._run_started: asyncio.Future[events.LoggedEvent] | None = None
        self.turbo = OptimisticStarts(self.settings, self.run_id)  # early inline bodies

    @property
    def replay(self) -> engine.Replay:
        assert self.session.replay is not None
        return self.session.replay

    # -- entry -------------------------------------------------------------------

    async def run(self) -> messages.HandlerResult:
        watch = None
        if self.meta.lease_lost is not None:
            watch = asyncio.get_running_loop().create_task(self._wake_on_lost_lease())
        try:
            return await self.turbo.deciding(self._run())
        except errors.RunExpired:
            await self.inline.settle(quiet=True)
            return messages.ACK  # the run ended under us (a cancel, say)
        except LeaseLost:
            await self.inline.settle(quiet=True)
            log.warning(
                "run %s: delivery of %s lost its lease; stopped without writing",
                self.run_id,
                self.meta.message_id,
            )
            return messages.Redeliver(constants.FENCE_REFUSAL_REDELIVERY_SECONDS)  # dropped
        except Superseded:
            await self.inline.settle(quiet=True)
            return await self._refused()
        except RunAheadRestartsSpent:
            await self.inline.settle(quiet=True)
            return messages.HANDOFF
        except Exception as exc:
            # Any other failure (a send, a read, a body's own write): no pass decides any
            # more, and the delivery fails only once its running bodies settled, so none
            # is cut off mid side effect (seed 003 "A later batch fails", FO4; bug 2).
            await self.inline.settle(quiet=True)
            writer = self.session.writer
            if writer is not None and writer.superseded is not None and not self.meta.lost_lease():
                # A body settling after the failure was refused by the fence: supersession
                # wins over any other failure (seed 003 "Refusal while bodies run"; A3).
                log.warning(
                    "run %s: delivery of %s failed (%s), then was refused by the fence",
                    self.run_id,
                    self.meta.message_id,
                    exc,
                )
                return await self._refused()
            raise
        finally:
            if watch is not None:
                watch.cancel()
            self.inline.cancel()  # only a cancelled delivery (its process stopping) has any
            await self.ahead.close()  # never cut a speculative write short
            if self._run_started is not None:
                await asyncio.wait([self._run_started])  # never cut a write short
            self.session.close()

    async def _refused(self) -> messages.HandlerResult:
        """A fence refusal: send what this delivery's committed writes still owe, then ask
        for a redelivery of its own message in about a second (seed 003 "Delivery")."""
        await self.session.send_owed()
        log.warning(
            "run %s: delivery of %s refused by the fence; redelivering in 1 s",
            self.run_id,
            self.meta.message_id,
        )
        return messages.Redeliver(constants.FENCE_REFUSAL_REDELIVERY_SECONDS)

    async def _wake_on_lost_lease(self) -> None:
        """Wake whatever the delivery waits on once the queue says its lease lapsed."""
        assert self.meta.lease_lost is not None
        await self.meta.lease_lost.wait()
        self.session.news.set()

    async def _run(self) -> messages.HandlerResult:
        await self.inline.flushes_landed()  # a handed-off stream flush lands first
        if not await self._load():
            return messages.ACK
        state = self.session.state
        telemetry.describe_run(state.workflow_name, state.spec_version)  # on the span
        if state.terminal is not None:
            return await self._finish()  # what it owes its parent and children
        if by_spec.hands_off(state.spec_version, specversions.Family.SPEC9):
            # A spec 8 run reached by a wrong hint: sent again with its own version before
            # anything replays (seed 003 "Resolving a delivery's spec").
            return await by_spec.hand_off(self.rt, self.message, state.spec_version)
        if state.deployment_id not in (None, self.rt.deployment_id):
            assert state.deployment_id is not None
            spec = state.spec_version
            return await pinning.reroute(
                self.rt, self.message, state.deployment_id, run_spec_version=spec
            )
        if state.spec_version not in constants.SUPPORTED_SPEC_VERSIONS:
            # Another release's run format: leave it, untouched, for a worker that has it.
            log.error(
                "run %s: spec version %s is not supported by this worker; leaving it",
                self.run_id,
                state.spec_version,
            )
            return messages.Redeliver(constants.MAX_REDELIVER_SECONDS)
        compat.require_fence(self.rt.world, state.spec_version, run_id=self.run_id)
        cap = self.settings.WORKFLOW_MAX_QUEUE_DELIVERIES
        # The queue's own count: a forged Treadle-Delivery-Offset header (H2) never fails a run.
        if self.meta.own_attempts > cap:
            await self.session.fail_out_of_band(
                events.ErrorInfo(
                    message=f"the run's orchestrator message was delivered {self.meta.attempt} "
                    f"times (WORKFLOW_MAX_QUEUE_DELIVERIES={cap})",
                    type="FatalError",
                    code="MAX_DELIVERIES_EXCEEDED",
                )
            )
            return messages.ACK
        workflow = self.rt.workflows.get(state.workflow_name)
        if workflow is None:
            await self.session.write_terminal(
                events.RunFailed(
                    error=events.ErrorInfo(
                        message=f"no workflow named {state.workflow_name!r} is registered in "
                        f"deployment {self.rt.deployment_id}",
                        type="WorkflowNotFound",
                    )
                )
            )
            return messages.ACK
        if self.meta.delivery_count > 1 or self.message.recovery:
            await self._resend_steps()
            await family.ensure_open(self.rt.world, state, self.meta.lost_lease)  # owed effects
        if self._nothing_new():
            if self.meta.delivery_count > 1:
                # A coalesced re-run may hold an early final timer: re-arm near-due waits,
                # or that wait would never complete (seed 003 "Near due (C2)"; audit C6).
                await self.waits.arm_near_due()
            return messages.ACK
        self.session.first_replay(workflow)  # a warm session's live one (orchestrator.warm)
        if not state.started:
            if self._turbo:
                # Queued on the writer ahead of every later write; not awaited here. Its
                # failure stops the writer: nothing queued behind it is written.
                self._run_started = self.session.write_soon(events.RunStarted(), required=True)
                self._run_started.add_done_callback(_retrieve)
                self.turbo.engage(self._run_started)
            else:
                await self.session.write(events.RunStarted())
        self.session.subscribe()
        await self.waits.arm_owned_chains()
        return await self._passes()

    def _nothing_new(self) -> bool:
        """A plain wake (a coalesced re-run, say) finding the log where this process left it,
        with no wait due: after the re-send pass, nothing to replay."""
        message = self.message
        plain = (
            message.run_input is None
            and message.wait_continuation is None
            and not message.complete_waits
            and not message.recovery
        )
        state = self.session.state
        return (
            plain
            and self.rt.consumed.get(self.run_id) == self.session.tail
            and not state.waits_woken()
            and not decisions.due_waits(state, now_ms=now_ms(), woken=set())
        )

    async def _load(self) -> bool:
        """Load the log (or synthesize it under turbo); False when the run does not exist."""
        start = self.message.run_input
        if (
            start is not None
            and self.settings.WORKFLOW_TURBO
            and self.meta.attempt == 1
            and self.meta.delivery_count == 1
        ):
            try:
                turbo = await turbo_start_from_record(
                    self.rt.world, self.run_id, start, self.meta.message_id
                )
            except errors.RunNotFound:
                log.warning(
                    "run %s: start message %s names no run; nothing run or written",
                    self.run_id,
                    self.meta.message_id,
                )
                return False
            if turbo is not None:
                self.session.synthesize(turbo)
                self._turbo = True
                return True
        try:
            await self.session.load(try_warm=True)
        except errors.RunNotFound:
            log.warning("run %s: message %s names no run", self.run_id, self.meta.message_id)
            return False
        return True

    # -- the passes ------------------------------------------------------------------

    async def _passes(self) -> messages.HandlerResult:
        while True:
            check_lease(self.meta, self.run_id)
            moved = self.session.state.deployment_id
            if moved not in (None, self.rt.deployment_id):
                # ``runs.repin`` moved the run while this delivery lingered on it: its log
                # now belongs to the new deployment, which the mover woke (``treadle.moves``).
                assert moved is not None
                await self.inline.settle()
                await self.session.send_owed()
                log.warning("run %s: moved to deployment %s mid-delivery", self.run_id, moved)
                spec = self.session.state.spec_version
                return await pinning.reroute(self.rt, self.message, moved, run_spec_version=spec)
            if now_ms() >= self.deadline_ms or self.inline.flush_handoff():
                await self.inline.settle()
                await self.waits.arm_owned_chains()
                self.session.keep_warm = True  # kept if at rest (orchestrator.warm)
                log.info("run %s: %s; handing off", self.run_id, self.inline.handoff_reason())
                return messages.HANDOFF
            if await self.ahead.attend():
                # Run-ahead repaired or restarted: replay from the new log, no early starts.
                self.turbo.end("a run-ahead repair or restart")
                continue
            await self.waits.complete_due_waits()
            outcome = self.replay.advance()
            if await self.ahead.before_acting(outcome):
                continue  # an end judged on the committed log; attr_sets written first
            await family.before_end(self.session, outcome)  # children started, not awaited
            match outcome:
                case engine.Ended():
                    return await self._finish()
                case engine.Completed(value=value):
                    await self.inline.settle()
                    name = self.session.state.workflow_name
                    try:
                        output = serde.encode(value, f"workflow {name} output")
                    except errors.SerializationError as exc:
                        await self.session.write_terminal(
                            events.RunFailed(error=steps.error_info(exc))
                        )
                    else:
                        await self.session.write_terminal(events.RunCompleted(output=output))
                    return await self._finish()
                case engine.Failed(error=error):
                    if not isinstance(error, errors.RunTimedOut):  # failed at its deadline,
                        await self.inline.settle()  # its bodies settle after (timeouts.md)
                    await self.session.write_terminal(
                        events.RunFailed(error=steps.error_info(error))
                    )
                    return await self._finish()
                case engine.Diverged() as diverged:
                    if not await self._recover_divergence(diverged):
                        return await self._finish()
                case engine.Suspended() as suspended:
                    result = await self._suspended(suspended)
                    if result is not None:
                        return result

    async def _started(self) -> None:
        """Turbo: wait for run_started (in flight since the delivery began); raise its refusal."""
        started, self._run_started = self._run_started, None
        if started is not None:
            await started

    async def _finish(self, *, warm: bool = False) -> messages.HandlerResult:
        await self._started()
        await self.inline.settle()
        # Told its lease lapsed, it writes nothing (F3; its redelivery does: sim seed 110).
        await family.after_terminal(self.rt.world, self.session.state, self.meta.lost_lease)
        self.session.consumed(keep_warm=warm)  # a clean suspension: keep the replay live
        return messages.ACK

    async def _recover_divergence(self, diverged: engine.Diverged) -> bool:
        """Replay cold in place; False once the budget is spent and the run failed."""
        self._divergences += 1
        budget = self.settings.WORKFLOW_REPLAY_DIVERGENCE_MAX_RETRIES
        spent = divergence.over_budget(log, self.run_id, diverged, self._divergences, budget)
        await self.inline.settle()
        self.turbo.end("a divergence recovery")
        if spent:
            await self.session.write_terminal(divergence.corrupted(self.run_id, diverged))
            return False
        workflow = self.rt.workflows[self.session.state.workflow_name]
        await self.session.load(keep_writer=True)
        self.session.start_replay(workflow)
        return True

    async def _suspended(self, suspended: engine.Suspended) -> messages.HandlerResult | None:
        """Write and start what the workflow waits on; None to run another pass."""
        if suspended.new or suspended.dispose:
            return await self._create(suspended)
        reruns = decisions.inline_to_rerun(self.session.state, self.inline.running)
        if reruns and await self.ahead.drain():
            return None
        if reruns:
            if not await self.inline.rerun(reruns):
                # No free inline slot: wait for a running body to settle (never spin; bug 4).
                await self._wait_for_news(self._next_wait_due_ms())
            return None
        if self.inline.busy or self.session.has_pending:
            await self._wait_for_news(self._next_wait_due_ms())
            return None
        if await self.ahead.drain() or self.inline.busy:
            return None  # replayed, or a body started once its start committed
        if await self.session.read_tail():
            return None
        decided = self.session.tail  # what this pass's replay decided on
        if self._should_linger():
            linger_ms = min(
                self.settings.WORKFLOW_ORCHESTRATOR_LINGER_MS,
                self.deadline_ms - self.margin_ms - now_ms(),
            )
            until = now_ms() + linger_ms
            next_due = self._next_wait_due_ms()
            if next_due is not None and next_due <= until:
                await self._wait_for_news(next_due, linger=True)
                return None  # news, or a wait came due: another pass either way
            if await self._wait_for_news(until, linger=True):
                return None
        if self.meta.delivery_count > 1:
            await self.waits.arm_near_due()
        if self.session.tail > decided:
            return None  # an event arrived after the last pass: decide on it first
        return await self._finish(warm=True)

    def _should_linger(self) -> bool:
        state = self.session.state
        return (
            self.session.feed_live
            and self.settings.WORKFLOW_ORCHESTRATOR_LINGER_MS > 0
            and (bool(state.open_hooks) or state.has_open_background_step())
            and self.deadline_ms - self.margin_ms - now_ms() > 0
        )

    async def _wait_for_news(self, until_ms: int | None, *, linger: bool = False) -> bool:
        """Wait for an inline body to settle, a new event, or ``until_ms``; True on news.

        The tail poll follows ``self._polls`` (``orchestrator.polling``). A ``linger``
        ends, False, as soon as the live feed does (seed 003: a linger needs the feed).
        """
        session = self.session
        self.ahead.kick()  # a speculative group goes out while this pass waits
        tail = session.tail
        limit = self.deadline_ms if until_ms is None else min(self.deadline_ms, until_ms)
        while True:
            poll_ms = self._polls.interval_ms(feed_live=session.feed_live)
            session.news.clear()
            check_lease(self.meta, self.run_id)
            if session.has_pending:
                self._polls.trouble()  # a push skipped a slot: the read fills the gap
                await session.read_tail()
            if session.tail > tail or self.inline.any_done() or self.ahead.needs_attention:
                self.inline.reap_done()
                return True
            # Checked after the news: a feed that brought an event and then dropped must
            # not end the linger as "nothing new" (seed 1309: the event was absorbed,
            # never decided on, and the wake it raised found the run "consumed").
            if linger and not session.feed_live:
                return False
            remaining = limit - now_ms()
            if remaining <= 0:
                return False
            wait_ms = min(remaining, poll_ms) if poll_ms > 0 else remaining
            # A settling inline body sets ``news`` too (``InlineSteps.start``): one wait.
            try:
                async with asyncio.timeout(wait_ms / 1000):
                    await session.news.wait()
            except TimeoutError:
                if poll_ms > 0:
                    await polling.poll(session, self._polls)

    def _next_wait_due_ms(self) -> int | None:
        due = [ms(w.resume_at) for w in self.session.state.open_waits()]
        return min(due) if due else None

    # -- creating what the workflow waits on -------------------------------------------

    async def _create(self, suspended: engine.Suspended) -> messages.HandlerResult | None:
        # Turbo's early starts take a boundary only while nothing of run-ahead is in flight
        # (an outcome run-ahead holds would land after turbo's next start); boundary() is
        # asked every time, so a suspension with a hook or a wait still ends them.
        early = self.turbo.boundary(suspended, self.inline.slots(), self.session.state)
        early = early and not self.ahead.speculating
        if not early:
            await self._started()  # the replay ran while it was in flight; nothing sent before
            if await self.ahead.create(suspended, self.inline.slots()):
                return None  # written ahead (bodies started), or replayed after a repair
        conflicts = await hookwrites.write_hooks(self.session, suspended)
        if conflicts:
            return await self._after_hook_conflict(conflicts)
        await family.create(self.session, suspended.new)  # child_created, then the runs
        waits = [op for op in suspended.new if isinstance(op, operations.Sleep)]
        calls = [op for op in suspended.new if isinstance(op, operations.StepCall)]
        inline = [c for c in calls if c.may_run_inline][: self.inline.slots()]
        batch: list[events.Event] = []
        for call in calls:
            batch += decisions.step_creation(
                call, inline=call in inline, creator_message_id=self.meta.message_id
            )
        for wait in waits:
            batch.append(
                events.WaitCreated(
                    correlation_id=wait.correlation_id,
                    resume_at=wait.resume_at,
                    creator_message_id=self.meta.message_id,
                    position=wait.position,
                )
            )
        if waits:
            await self.waits.arm_new_waits(waits)  # before wait_created commits
        starts = {call.correlation_id: call for call in inline}
        self.inline.creations_written.clear()  # outcomes queue behind the last batch
        try:
            if early:
                bodies, starts = self.turbo.split(starts)
                for call in bodies:  # before their start commits (orchestrator.turbo)
                    self.inline.start_early(call, self.turbo.gate(call.correlation_id))
            for chunk in decisions.creation_batches(batch):
                await self._write_creations(chunk, starts)
        finally:
            self.turbo.close_batch()  # a start not committed: its early outcome is discarded
            self.inline.creations_written.set()
        return None

    async def _after_hook_conflict(self, hook_ids: list[str]) -> messages.HandlerResult | None:
        """The pass decided before its hook's conflict existed: replay afresh (once per
        hook), so ``conflict()`` answers as every later replay will; else hand off."""
        if self._hook_conflicts.may_continue(hook_ids):
            self.session.start_replay(self.rt.workflows[self.session.state.workflow_name])
            return None
        await self.inline.settle()
        await self.waits.arm_owned_chains()
        return messages.HANDOFF

    async def _write_creations(
        self, batch: list[events.Event], starts: dict[str, operations.StepCall]
    ) -> None:
        """Write one creation batch; start its inline bodies at once, then send its steps.

        The bodies start before the sends and before any later batch, so neither a failed
        send nor a later batch's refusal leaves a committed inline start unrun (bug 3).
        A write with an unknown outcome is settled by the writer in place (found
        committed, or written again), so the bodies of a batch that committed start here
        too (seeds 216, 232).
        """
        committed, refused = await self.session.write_batch(batch)
        self.turbo.confirm(committed)
        sends = []
        for logged in committed:
            event = logged.event
            call = starts.get(event.correlation_id or "")
            if isinstance(event, events.StepStarted) and event.inline and call is not None:
                self.inline.start_committed(call)
            if isinstance(event, events.StepCreated) and not event.inline:
                send = self.session.step_send(
                    event.correlation_id,
                    event.step_name,
                    event.input,
                    created_at=logged.created_at,
                    max_retries=event.max_retries,
                )
                self.session.owe(send)
                sends.append(send)
        await self.session.send(sends)
        if refused:
            log.warning("run %s: %d creations refused: %s", self.run_id, len(refused), refused[0])
            raise refused[0]

    async def _resend_steps(self) -> None:
        """The re-send rule, once per invocation: steps whose first send may be lost.

        An invocation is one queue delivery and its coalesced re-runs (which count
        ``delivery_count`` up by ``rerun``). Two deliveries of one message can start in
        the same millisecond (a lapsed lease's copy, redelivered at once): keyed by
        their start time alone, the second skipped its re-send after the first one's
        had failed, and steps created but never sent were left unrun (seeds 44, 1186).
        The key is marked only once the sends succeeded, so a failed pass is retried.
        """
        meta = self.meta
        invocation = (
            f"{meta.message_id}/{meta.delivery_count - meta.rerun}/{meta.invocation_started_at}"
        )
        if self.rt.resent_invocations.seen(invocation):
            return  # an earlier re-run of this delivery re-sent them
        resends = decisions.steps_to_resend(
            self.session.state, now=clock.utcnow(), recovery=self.message.recovery
        )
        sends = [
            self.session.step_send(
                r.step.step_id,
                r.step.step_name,
                r.step.input,
                created_at=r.step.created_at,
                max_retries=r.step.max_retries,
                attempt=r.attempt,
                resent=True,
                delay_seconds=r.delay_seconds,
            )
            for r in resends
        ]
        telemetry.reenqueued(len(sends), recovery=self.message.recovery)  # seed 003 attrs
        if sends:
            log.debug("run %s: re-sending %d step messages", self.run_id, len(sends))
            await self.session.send(sends)
        # Marked once sent: a send that raised leaves it unmarked, so the redelivery's pass
        # sends again even where its key repeats (seed 1186: a step left unsent for ever).
        self.rt.resent_invocations.mark(invocation)
