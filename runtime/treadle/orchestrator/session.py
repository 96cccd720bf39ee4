"""A delivery's hold on its run's log: load, absorb in slot order, write, send.

``RunSession`` keeps the events a delivery holds (the ``Replay`` it feeds and
the ``LogState`` folded beside it), takes new ones from write results, the
live feed and tail reads, and hands them over only in slot order without gaps
(consume after commit: an own write's event is taken after the events its
skipped-slot report names). It also tracks what this delivery's committed
writes owe the queue, so a refused delivery can send exactly that.

Used by ``orchestrator.delivery``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from treadle import errors, runtimeouts
from treadle.orchestrator import children, hookclaims, hookdrain, reads, streamflush, warm
from treadle.orchestrator.logstate import LogState
from treadle.orchestrator.runtime import Runtime, step_key
from treadle.orchestrator.writer import InBandWriter, LeaseLost
from treadle.replay import engine
from treadle.replay.operations import ChildScope
from treadle.sdk import functions
from treadle.world import constants, contract, events, messages, records

log = logging.getLogger("treadle.orchestrator.session")


class RunSession:
    def __init__(self, rt: Runtime, run_id: str, lease_lost: asyncio.Event | None = None) -> None:
        self.rt = rt
        self.run_id = run_id
        # The queue's word that the delivery lost its lease: the writer then refuses.
        self.lease_lost = lease_lost
        self.state = LogState(run_id)
        self.replay: engine.Replay | None = None
        self.writer: InBandWriter | None = None
        self.loaded: list[events.LoggedEvent] = []
        self.news = asyncio.Event()
        self.feed_live = False
        self._pending: dict[int, events.LoggedEvent] = {}
        self._feed: contract.Subscription | None = None
        self._owed: dict[str, messages.Send] = {}
        self._sent: set[str] = set()
        # Run-ahead (``orchestrator.runahead``): while events above ``confirmed`` are held
        # that were handed to the replay before their write committed, committed events
        # from anywhere are kept in ``_stash`` until run-ahead settles, never fed.
        self.confirmed: int | None = None
        self._stash: dict[int, events.LoggedEvent] = {}
        # Warm sessions (``orchestrator.warm``): the workflow a kept replay was adopted for
        # (None: cold), and whether ``close`` may keep this one's replay for the next
        # delivery (set by the delivery at a clean suspension).
        self.warm_workflow: functions.WorkflowFunction[Any, Any] | None = None
        self.keep_warm = False
        # Holds turbo's synthesized run_created (not read from the log): a session kept
        # from it is continued only once the log's own slot 1 was read and found equal.
        self.synthesized = False

    @property
    def tail(self) -> int:
        return self.replay.log_tail if self.replay is not None else self.state.tail

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    @property
    def has_stash(self) -> bool:
        return bool(self._stash)

    def consumed(self, *, keep_warm: bool = False) -> None:
        """The delivery ends having consumed the log through ``tail`` (the no-op wake's
        fast path); ``keep_warm``: at a clean suspension, so ``close`` may keep its replay."""
        self.rt.consumed[self.run_id] = self.tail
        self.keep_warm = keep_warm

    def close(self) -> None:
        if self._feed is not None:
            self._feed.close()
            self._feed = None
        if self.keep_warm:
            self.keep_warm = False
            warm.keep(self)  # the replay stays live in the cache, or is closed below
        if self.replay is not None:
            self.replay.close()

    # -- loading -------------------------------------------------------------------

    def synthesize(self, start: messages.RunInput) -> None:
        """Turbo: the start message's first delivery takes the log as ``[run_created]``."""
        created = events.LoggedEvent(
            run_id=self.run_id,
            slot=1,
            created_at=start.created_at,
            in_band=True,
            event=events.RunCreated(
                workflow_name=start.workflow_name,
                input=start.input,
                deployment_id=start.deployment_id or self.rt.deployment_id,
                spec_version=start.spec_version,
                attributes=dict(start.attributes),
            ),
        )
        self.loaded = [created]
        self.synthesized = True
        self.state.apply(created)
        snapshot = events.Snapshot(seq=1, seq_in_band=constants.IN_BAND_SEQ_AT_RUN_CREATION)
        self.writer = self._writer(snapshot)

    def _writer(self, snapshot: events.Snapshot) -> InBandWriter:
        return InBandWriter(
            self.rt.world,
            self.run_id,
            snapshot,
            self.lease_lost,
            read_timeout_ms=self.rt.settings.WORKFLOW_ORCHESTRATOR_READ_TIMEOUT_MS,
        )

    async def load(self, *, keep_writer: bool = False, try_warm: bool = False) -> None:
        """A full load; the writer adopts the first page's snapshot (never a count).
        ``try_warm``: first try this run's warm session (``orchestrator.warm``): read only the
        log after it, and load in full only when it cannot continue."""
        if try_warm and await self._resume_warm():
            return
        page = await self.rt.world.events.list(self.run_id)
        snapshot = page.snapshot
        loaded = list(page.events)
        while page.has_more:
            page = await self.rt.world.events.list(self.run_id, after_slot=page.cursor)
            loaded.extend(page.events)
        if len(loaded) < snapshot.seq:
            raise errors.WorldContractError(
                f"run {self.run_id}: a full load returned {len(loaded)} events below the "
                f"snapshot's seq {snapshot.seq}",
                run_id=self.run_id,
            )
        self.loaded = loaded
        self.synthesized = False
        self.drop_speculation()
        self.state = LogState(self.run_id)
        for event in loaded:
            self.state.apply(event)
        if not keep_writer or self.writer is None:
            self.writer = self._writer(snapshot)
        await hookclaims.repay(self.rt, self.run_id, self.state)  # force-claims owing a wake

    async def claimed(self, created: events.HookCreated) -> None:
        """A hook creation the World stored as a force-claim: wake its victim."""
        await hookclaims.waker(self.rt, self.run_id)(created)

    async def _resume_warm(self) -> bool:
        """Adopt the run's warm session when the log after it continues it; else drop it."""
        kept = self.rt.warm.take(self.run_id)
        if kept is None:
            return False
        reason = warm.usable(self, kept)
        new: list[events.LoggedEvent] = []
        snapshot: events.Snapshot | None = None
        try:
            if reason is None and kept.synthesized:
                # Seed 003: a re-run of turbo's first delivery reads the log, never trusts
                # the synthesis: the log's slot 1 must be what the session was built on.
                first = await self.rt.world.events.list(self.run_id, limit=1)
                if list(first.events[:1]) != kept.loaded[:1]:
                    reason = "synthesized"
            if reason is None:
                page = await self._read_page(kept.tail, reads.READ_ATTEMPTS)
                snapshot, new = page.snapshot, list(page.events)
                while page.has_more:
                    page = await self._read_page(page.cursor, reads.READ_ATTEMPTS)
                    new.extend(page.events)
                reason = warm.discontinuity(kept, snapshot, new)
        except BaseException:
            kept.close()
            raise
        if reason is not None or snapshot is None:
            warm.STATS.cold[reason or "unread"] += 1
            log.debug("run %s: warm session dropped (%s); loading cold", self.run_id, reason)
            kept.close()
            return False
        self.drop_speculation()
        self.loaded, self.state, self.replay = kept.loaded, kept.state, kept.replay
        self.warm_workflow = kept.workflow
        for event in new:
            self.replay.feed(event)
            self.loaded.append(event)
            self.state.apply(event)
        self.writer = self._writer(snapshot)
        warm.STATS.resumed += 1
        warm.STATS.events_folded += len(new)
        if warm.VERIFY is not None:
            warm.VERIFY(self)
        return True

    def first_replay(self, workflow: functions.WorkflowFunction[Any, Any]) -> engine.Replay:
        """The delivery's replay: the warm one it adopted for ``workflow``, else a new one."""
        if self.replay is not None and self.warm_workflow is workflow:
            return self.replay
        return self.start_replay(workflow)

    def new_replay(self, workflow: functions.WorkflowFunction[Any, Any]) -> engine.Replay:
        """A fresh replay of this run's workflow, fed nothing yet: its input decoded, its run
        timeout, child scope and format set (the warm-session check builds its cold replay
        here too, so the two cannot differ in how they start)."""
        body: Callable[..., Awaitable[Any]] = workflow.fn
        try:
            args, kwargs = functions.decode_arguments(
                self.state.input, f"workflow {workflow.name} input"
            )
        except errors.SerializationError as exc:  # the run fails with it, on every replay
            args, kwargs, body = [], {}, functions.refusing(exc)
        run_timeout = runtimeouts.recorded(self.state.input)
        if run_timeout is not None and self.state.spec_version < 9:
            # A spec 8 run cannot hold the run timeout's in-band wait: it fails, clearly.
            body = functions.refusing(errors.FeatureNeedsSpec9("a run timeout", run_id=self.run_id))
            run_timeout = None
        replay = engine.Replay(
            run_id=self.run_id,
            workflow_name=self.state.workflow_name,
            workflow=body,
            args=args,
            kwargs=kwargs,
            created_at=self.state.created_at,
            spec_version=self.state.spec_version,
            run_timeout=run_timeout,
        )
        # Child workflows: the workflows registered here, and whether the run may have any.
        replay.child_scope = ChildScope(frozenset(self.rt.workflows), self.state.spec_version)
        replay.spec_version = self.state.spec_version  # spec 9 only features refuse
        return replay

    def start_replay(self, workflow: functions.WorkflowFunction[Any, Any]) -> engine.Replay:
        if self.replay is not None:
            self.replay.close()
        self.replay = self.new_replay(workflow)
        for event in self.loaded:
            self.replay.feed(event)
        return self.replay

    # -- absorbing events in slot order -------------------------------------------------

    def offer(self, committed: Sequence[events.LoggedEvent]) -> None:
        """Take committed events; only the gap-free run above what we hold is consumed."""
        if self.confirmed is not None:
            for event in committed:
                if event.slot > self.confirmed:
                    self._stash[event.slot] = event
            return
        tail = self.tail
        for event in committed:
            if event.slot > tail:
                self._pending[event.slot] = event
        if not self._pending:
            return  # all held already (the feed's echo of an own write, say)
        while (following := self._pending.pop(self.tail + 1, None)) is not None:
            if self.replay is not None:
                self.replay.feed(following)
            self.loaded.append(following)
            self.state.apply(following)
        for slot in [s for s in self._pending if s <= self.tail]:
            del self._pending[slot]
        if self.writer is not None:
            self.writer.hold_through(self.tail)

    # -- run-ahead: events handed over before their write committed ------------------------

    def speculate(self, event: events.Event, at: datetime) -> events.LoggedEvent:
        """Hand ``event`` to the replay at the predicted slot (the next one) and time ``at``,
        before its write commits; the orchestrator's bookkeeping takes it too."""
        if self.confirmed is None:
            self.confirmed = self.tail
        logged = events.LoggedEvent(
            run_id=self.run_id, slot=self.tail + 1, created_at=at, in_band=True, event=event
        )
        if self.replay is not None:
            self.replay.feed(logged)
        self.loaded.append(logged)
        self.state.apply(logged)
        return logged

    def confirm(self, committed: Sequence[events.LoggedEvent]) -> None:
        """Speculative events committed where and as predicted: they are the log now."""
        assert self.confirmed is not None
        for event in committed:
            index = event.slot - 1
            if 0 <= index < len(self.loaded) and self.loaded[index].slot == event.slot:
                self.loaded[index] = event
            self.confirmed = max(self.confirmed, event.slot)
        for slot in [s for s in self._stash if s <= self.confirmed]:
            del self._stash[slot]

    def end_speculation(self) -> None:
        """Every speculative write confirmed: take what was stashed above them, in order."""
        if self.confirmed is None or self.confirmed < self.tail:
            return
        stash, self._stash, self.confirmed = self._stash, {}, None
        self.offer(sorted(stash.values(), key=lambda e: e.slot))
        if self.writer is not None:
            self.writer.hold_through(self.tail)

    def drop_speculation(self) -> None:
        """Before a reload: forget speculative events and the stash (the load has both)."""
        self.confirmed = None
        self._stash = {}

    async def read_tail(self, *, attempts: int = reads.READ_ATTEMPTS) -> bool:
        """Read what landed after what we hold; True when something new arrived.

        Each page is read under the read deadline (``orchestrator.reads``): a read
        that keeps not answering raises ``ReadTimedOut`` and the delivery gives up.
        """
        before = after = self.tail
        while True:
            page = await self._read_page(after, attempts)
            self.offer(page.events)
            if not page.has_more:
                break
            after = page.cursor
        return self.tail > before

    async def poll_tail(self) -> bool | None:
        """One poll of the tail (a single attempt): True on news, None when it timed out."""
        try:
            return await self.read_tail(attempts=1)
        except errors.ReadTimedOut:
            return None

    async def _read_page(self, after: int, attempts: int) -> records.EventPage:
        def read() -> Awaitable[records.EventPage]:
            return self.rt.world.events.list(self.run_id, after_slot=after)

        return await reads.bounded(
            read,
            timeout_ms=self.rt.settings.WORKFLOW_ORCHESTRATOR_READ_TIMEOUT_MS,
            run_id=self.run_id,
            what=f"the tail read after slot {after}",
            attempts=attempts,
        )

    def subscribe(self) -> None:
        if not self.rt.world.capabilities.live_feed:
            return

        def on_event(event: events.LoggedEvent) -> None:
            self.offer([event])
            self.news.set()

        def on_error(exc: BaseException) -> None:
            log.info("run %s: live feed error: %s", self.run_id, exc)
            self.feed_live = False
            self.news.set()

        self._feed = self.rt.world.events.subscribe(self.run_id, self.tail, on_event, on_error)
        self.feed_live = True

    # -- writing -------------------------------------------------------------------------

    async def write(self, event: events.Event) -> events.LoggedEvent:
        """One in-band write, consumed after it commits, behind its report."""
        assert self.writer is not None
        return await self._absorb(await self.writer.create(event))

    def write_soon(
        self, event: events.Event, *, required: bool = False
    ) -> asyncio.Task[events.LoggedEvent]:
        """``write``, queued on the writer now (ahead of every later write), not awaited;
        ``required``: its failure stops the writer (``InBandWriter.create_soon``)."""
        assert self.writer is not None
        written = self.writer.create_soon(event, required=required)

        async def absorbed() -> events.LoggedEvent:
            return await self._absorb(await written)

        return asyncio.ensure_future(absorbed())

    async def _absorb(self, result: records.EventResult) -> events.LoggedEvent:
        self.offer(result.report)
        self.offer([result.event])
        if result.has_more:
            await self.read_tail()
        return result.event

    async def write_batch(
        self, batch: list[events.Event]
    ) -> tuple[list[events.LoggedEvent], list[errors.WorldError]]:
        assert self.writer is not None
        result = await self.writer.create_batch(batch)
        self.offer(result.report)
        committed = [item.event for item in result.items if item.event is not None]
        self.offer(committed)
        if result.has_more:
            await self.read_tail()
        return committed, [item.error for item in result.items if item.error is not None]

    async def write_terminal(self, event: events.Event) -> None:
        # The World takes no stream chunk once the run ended: this process's flushes first.
        await streamflush.wait_pending(self.run_id)
        if self.replay is not None and self.replay.finished:
            await hookdrain.write(self)  # seed 003 "Terminal hook disposal"
        with contextlib.suppress(errors.RunExpired):
            await self.write(event)

    def stale(self) -> bool:
        """The queue told this delivery its lease lapsed: it writes nothing more (F3)."""
        return self.lease_lost is not None and self.lease_lost.is_set()

    async def fail_out_of_band(self, error: events.ErrorInfo) -> None:
        if self.stale():
            raise LeaseLost(f"run {self.run_id}: the delivery lost its lease; nothing is written")
        with contextlib.suppress(errors.RunExpired):
            await self.rt.world.events.create(
                self.run_id, events.RunFailed(error=error), in_band=False
            )
        if self.state.children.involved:  # child workflows: its parent, its children
            await children.after_end(self.rt.world, self.run_id)

    # -- sending -------------------------------------------------------------------------

    def owe(self, send: messages.Send) -> None:
        """A committed write owes this message until it is sent."""
        if send.key is not None and send.key not in self._sent:
            self._owed[send.key] = send

    async def send(self, sends: Sequence[messages.Send]) -> None:
        todo = [s for s in sends if s.key is None or s.key not in self._sent]
        if not todo:
            return
        await self.rt.world.queue.send_batch(_scoped(todo, self.state.repinned_slot))
        for item in todo:
            if item.key is not None:
                self._sent.add(item.key)
                self._owed.pop(item.key, None)

    def was_sent(self, key: str) -> bool:
        return key in self._sent

    async def send_owed(self) -> None:
        """After a refusal: exactly what this delivery's committed writes still owe."""
        owed = list(self._owed.values())
        if not owed:
            return
        try:
            await self.send(owed)
        except Exception:
            log.exception(
                "run %s: sending %d owed messages failed; the redelivery re-sends them",
                self.run_id,
                len(owed),
            )

    def step_send(
        self,
        step_id: str,
        step_name: str,
        step_input: Any,
        *,
        created_at: datetime,
        max_retries: int | None,
        attempt: int = 1,
        resent: bool = False,
        delay_seconds: float = 0.0,
    ) -> messages.Send:
        """A step's one message, under its stable key: ids, never the input (the handler
        takes the step's input from its creation in the log, security review H2).
        ``step_input`` is not sent; an older handler reads it from the log too
        (``input_in_log``)."""
        del step_input
        state = self.state
        message = messages.StepMessage(
            run_id=self.run_id,
            deployment_id=state.deployment_id,
            step_id=step_id,
            step_name=step_name,
            step_created_at=created_at,
            step_resent=resent,
            run_context=messages.RunContext(
                spec_version=state.spec_version,
                deployment_id=state.deployment_id,
                workflow_name=state.workflow_name,
            ),
            input_in_log=True,
            max_retries=max_retries,
            step_attempt=attempt,
        )
        return messages.Send(message, step_key(self.run_id, step_id), delay_seconds)


def _scoped(sends: list[messages.Send], repinned_slot: int | None) -> list[messages.Send]:
    """A moved run's keyed sends, keyed apart from what the old deployment sent.

    The queue deduplicates a key for 24 h across deployments: the new deployment's
    re-armed timer or re-sent step under the old one's key would be dropped, and the
    old one's message sits on a subject nobody may consume (``treadle.moves``).
    """
    if repinned_slot is None:
        return sends
    return [
        s if s.key is None else dataclasses.replace(s, key=f"{s.key}@moved{repinned_slot}")
        for s in sends
    ]
