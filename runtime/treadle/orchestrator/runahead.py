"""Run-ahead on spec 9 runs (seed 003 "Run-ahead", its hazards, "A hazard stop and the
restart in place", "Recovering from a run-ahead stop").

At a boundary classified inert (``inert``: no open hook, no step running elsewhere, no
wait due within the inline window plus 30 s), an inline step's outcome is handed to the
workflow replay before its ``step_completed`` commits, at the slot the writer will give
it (the next one), at most ``WORKFLOW_RUN_AHEAD_DEPTH`` outcomes unconfirmed. The next
boundary's creations (the next inline steps' ``step_started``) join the same group, and
their bodies start at once (a ``max_retries=0`` body only once its start committed), so
a step's outcome and the next start go to the World in one ``create_batch``, stored at
the one time the workflow used (``occurred_at``).

Every committed group is checked (``_check``): an event of another writer below it is
tested by ``run_ahead_hazard``; a hazard, a refused item, or a stored time other than
``occurred_at`` (which also turns run-ahead off for that World for the process) stops
run-ahead: no later decision is written, only outcomes of steps whose start committed;
the delivery sends what its writes owe and restarts in place (fresh writer, full load,
cold replay, run-ahead off for the rest of the delivery; ``MAX_RUN_AHEAD_RESTARTS``,
past it the message is handed off). A harmless event below, or a slot other than the
predicted one, is a repair: the delivery drains, reloads and replays, and keeps going.
A stop can run twice the bodies of refused speculative creations (seed 003 "Step bodies
a run-ahead stop can run twice"), at most the depth; ``STATS`` counts them.

Used by ``orchestrator.delivery`` and ``orchestrator.inline``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from treadle import clock, errors
from treadle.orchestrator import attributes as attribute_writes
from treadle.orchestrator import decisions
from treadle.orchestrator.logstate import LogState
from treadle.orchestrator.runtime import Runtime
from treadle.orchestrator.session import RunSession
from treadle.orchestrator.waits import ms, now_ms
from treadle.replay import engine, operations
from treadle.world import events, messages

if TYPE_CHECKING:
    from treadle.orchestrator.inline import InlineSteps

log = logging.getLogger("treadle.orchestrator.runahead")

MAX_RUN_AHEAD_RESTARTS = 1
# Events of one speculative group (seed 003: "at most 16 events").
MAX_SPECULATIVE_BATCH_EVENTS = 16
# A wait due within the inline window plus this makes a boundary not inert.
NEAR_WAIT_MARGIN_MS = 30_000

HOOK_EVENTS = (events.HookReceived, events.HookDisposed, events.HookConflict)
STEP_EVENTS = (events.StepStarted, events.StepCompleted, events.StepFailed, events.StepRetrying)
OUTCOMES = (events.StepCompleted, events.StepFailed)

# Worlds (by id) that stored a speculative write at a time other than its occurred_at:
# run-ahead is off for them for the rest of the process.
_off_for_worlds: set[int] = set()


@dataclass
class RunAheadStats:
    """Process-wide counts (the simulation reports them; never reset by the runtime)."""

    groups: int = 0
    repairs: int = 0
    stops: int = 0
    restarts: int = 0
    # Bodies of refused speculative creations: the restarted pass may run them again
    # (seed 003 "Step bodies a run-ahead stop can run twice"), and the most in one stop.
    bodies_at_risk: int = 0
    most_at_risk_in_a_stop: int = 0


STATS = RunAheadStats()


class RunAheadRestartsSpent(errors.TreadleError):
    """A run-ahead stop past ``MAX_RUN_AHEAD_RESTARTS``: the delivery hands off."""


def run_ahead_hazard(
    event: events.Event, *, inline_steps: Collection[str], inert_hooks: Collection[str] = ()
) -> str | None:
    """Why ``event``, another writer's, below a speculative write would have made its
    boundary path-changing; None when it would not (seed 003 "Hazards").

    Every hook is sensitive here (treadle does not tell an unawaited hook apart: the
    classification runs ahead with no open hook at all) unless named in ``inert_hooks``.
    """
    cid = event.correlation_id
    if isinstance(event, HOOK_EVENTS):
        return None if cid in inert_hooks else f"{event.type} of hook {cid}"
    if isinstance(event, STEP_EVENTS):
        return None if cid in inline_steps else f"{event.type} of step {cid}, not run inline here"
    if isinstance(event, events.WaitCompleted):
        return f"wait_completed of wait {cid} (only the orchestrator completes waits)"
    if isinstance(event, events.ChildCompleted | events.ChildFailed):
        return f"{event.type} of child {cid}"
    return None  # run_cancelled, attr_set, wake_requested, ...: never


def inert(state: LogState, *, window_end_ms: int) -> bool:
    """No other writer could append what changes the workflow's next step (seed 003
    "When a boundary may run ahead"): no open hook, no step running elsewhere, no wait
    due within the inline window plus 30 s, no wake-up pending, the run not ended."""
    if state.terminal is not None or state.open_hooks or state.has_open_background_step():
        return False
    if state.children.open:
        return False  # a child's outcome is another writer's event (child workflows)
    if state.waits_woken():
        return False
    horizon = window_end_ms + NEAR_WAIT_MARGIN_MS
    return all(ms(w.resume_at) > horizon for w in state.open_waits())


@dataclass
class _Group:
    """Speculative events written together, at one time."""

    at: datetime
    events: list[events.LoggedEvent] = field(default_factory=list)
    # Creations whose body waits for the commit (``max_retries=0``), by step id.
    deferred: dict[str, operations.StepCall] = field(default_factory=dict)
    outcomes: int = 0
    has_creation: bool = False
    sent: asyncio.Event = field(default_factory=asyncio.Event)


class RunAhead:
    def __init__(
        self,
        rt: Runtime,
        session: RunSession,
        inline: InlineSteps,
        meta: messages.DeliveryMeta,
        window_end_ms: int,
    ) -> None:
        self.rt = rt
        self.session = session
        self.inline = inline
        self.meta = meta
        self.run_id = session.run_id
        self.window_end_ms = window_end_ms
        self.depth = rt.settings.WORKFLOW_RUN_AHEAD_DEPTH
        self.enabled = self.depth > 0 and id(rt.world) not in _off_for_worlds
        self.restarts = 0
        self.repair = False
        self.stop: str | None = None
        self._hazard = False  # the stop found another writer's path-changing event
        self.failure: BaseException | None = None
        self._open: _Group | None = None
        self._queue: list[_Group] = []
        self._sending: _Group | None = None
        self._kicked = False
        self._pump: asyncio.Task[None] | None = None
        self._unconfirmed_outcomes = 0
        self._room = asyncio.Event()
        self._draining = False
        # Steps whose speculative creation has not committed (refused ones stay here).
        self._uncommitted_starts: set[str] = set()
        self._refused_starts: set[str] = set()
        self._orphans: set[asyncio.Task[None]] = set()
        # Streams: a body started ahead of its start has its chunks wait on this (True
        # once the start committed, False once refused or the delivery ended).
        self._start_gates: dict[str, asyncio.Future[bool]] = {}
        inline.runahead = self

    # -- state -----------------------------------------------------------------------

    def start_gate(self, step_id: str) -> asyncio.Future[bool] | None:
        """The stream barrier of a body whose speculative start has not committed yet."""
        if step_id not in self._uncommitted_starts:
            return None
        return self._start_gates.setdefault(step_id, asyncio.get_running_loop().create_future())

    def _settle_gate(self, step_id: str, committed: bool) -> None:
        gate = self._start_gates.pop(step_id, None)
        if gate is not None and not gate.done():
            gate.set_result(committed)

    @property
    def starting(self) -> set[str]:
        """Steps written ahead whose body waits for its start to commit (max_retries=0)."""
        return {cid for group in self._groups() for cid in group.deferred}

    def _groups(self) -> list[_Group]:
        ends = [g for g in (self._sending, self._open) if g is not None]
        return [*self._queue, *ends]

    @property
    def speculating(self) -> bool:
        return self.session.confirmed is not None or self._open is not None or self._busy()

    @property
    def needs_attention(self) -> bool:
        return self.failure is not None or self.stop is not None or self.repair

    def _busy(self) -> bool:
        return bool(self._queue) or (self._pump is not None and not self._pump.done())

    def _may_speculate(self) -> bool:
        return (
            self.enabled
            and not self._draining
            and not self.needs_attention
            and self.session.replay is not None
            and not self.meta.lost_lease()
            and inert(self.session.state, window_end_ms=self.window_end_ms)
        )

    # -- the workflow's side: outcomes and creations ahead of their commit -------------

    async def outcome(self, step_id: str, event: events.Event, kind: str) -> bool:
        """An inline body's outcome: True when handled here (handed to the replay ahead
        of its write, or dropped: the body of a refused speculative creation)."""
        if asyncio.current_task() in self._orphans:
            log.info("run %s: outcome of step %s dropped: its start was refused", self.run_id,
                     step_id)  # fmt: skip
            return True
        if kind == "retry" or not isinstance(event, OUTCOMES):
            await self._behind_speculation()
            return asyncio.current_task() in self._orphans
        while self._may_speculate() and self._unconfirmed_outcomes >= self.depth:
            # At the cap: wait for an earlier speculative write to settle, then run ahead too.
            self._room.clear()
            self.kick()
            await self._room.wait()
        if asyncio.current_task() in self._orphans:
            return True  # refused while it waited for room
        if not self._may_speculate():
            await self._behind_speculation()
            return asyncio.current_task() in self._orphans
        if self._open is not None and len(self._open.events) >= MAX_SPECULATIVE_BATCH_EVENTS:
            self._seal()  # full: it goes out as it is
            self.kick()
        group = self._group()
        group.events.append(self.session.speculate(event, group.at))
        group.outcomes += 1
        self._unconfirmed_outcomes += 1
        return True

    async def create(self, suspended: engine.Suspended, slots: int) -> bool:
        """A boundary's creations: True when handled here (written ahead, their bodies
        started) or when run-ahead had to replay first (the caller starts a new pass);
        False: the caller writes them, awaited, with nothing of run-ahead in flight."""
        new = suspended.new
        calls = [op for op in new if isinstance(op, operations.StepCall)]
        group = self._open
        pending = len(group.events) if group is not None else 0
        if (
            self._may_speculate()
            and not suspended.dispose
            and calls
            and len(calls) == len(new)
            and all(c.may_run_inline for c in calls)
            and len(calls) <= slots
        ):
            if pending + len(calls) > MAX_SPECULATIVE_BATCH_EVENTS:
                self._seal()
            group = self._group()
            for call in calls:
                (start,) = decisions.step_creation(
                    call, inline=True, creator_message_id=self.meta.message_id
                )
                group.events.append(self.session.speculate(start, group.at))
                group.has_creation = True
                self._uncommitted_starts.add(call.correlation_id)
                if call.max_retries == 0:
                    group.deferred[call.correlation_id] = call  # never before its start
                else:
                    self.inline.start_committed(call)
            self.kick()
            return True
        return await self.drain()

    async def _behind_speculation(self) -> None:
        """Before a body writes on its own: every speculative group asked for so far is
        written first (its step's creation may be among them)."""
        self.kick()
        last = self._open or (self._queue[-1] if self._queue else None)
        if last is not None:
            await last.sent.wait()

    def _group(self) -> _Group:
        """The open group; every event joining it is stored at its one time (a write
        in flight holds it open: its events' times lag by at most that write)."""
        if self._open is None:
            self._open = _Group(at=clock.utcnow())
        return self._open

    # -- the World's side: sending and checking --------------------------------------

    def kick(self) -> None:
        """Send the open group: now, or as soon as the write in flight committed (what
        joined it meanwhile goes in the same write)."""
        if self._open is not None:
            self._kicked = True
        elif not self._queue:
            return
        if self._pump is None or self._pump.done():
            self._pump = asyncio.get_running_loop().create_task(
                self._send_queued(), name=f"treadle-run-ahead-{self.run_id}"
            )

    def _seal(self) -> None:
        """The open group is full: it goes out as it is, and a new one opens."""
        if self._open is not None:
            self._queue.append(self._open)
            self._open = None

    def _next_group(self) -> _Group | None:
        if self._queue:
            return self._queue.pop(0)
        group = self._open
        if group is None or not self._kicked:
            return None
        self._open, self._kicked = None, False
        return group

    async def _send_queued(self) -> None:
        while (group := self._next_group()) is not None:
            self._sending = group
            try:
                await self._send(group)
            finally:
                self._sending = None
                group.sent.set()
                self._unconfirmed_outcomes -= group.outcomes
                self._room.set()
                self.session.news.set()

    async def _send(self, group: _Group) -> None:
        writer = self.session.writer
        assert writer is not None
        chosen: list[events.LoggedEvent] = []

        def select(batch: Sequence[events.Event]) -> Sequence[events.Event]:
            keep = group.events
            if self.stop is not None or self.failure is not None:
                # Stopped: only outcomes of steps whose start committed are still written.
                keep = [e for e in group.events if self._still_allowed(e.event)]
                for dropped in group.events:
                    if dropped not in keep and isinstance(dropped.event, events.StepStarted):
                        self._refuse_start(dropped.event.correlation_id)
            chosen.extend(keep)
            return [e.event for e in keep]

        STATS.groups += 1
        try:
            result = await writer.create_batch(
                [e.event for e in group.events], occurred_at=group.at, select=select
            )
        except BaseException as exc:
            if self.failure is None:
                self.failure = exc
            for e in group.events:
                if isinstance(e.event, events.StepStarted):
                    self._refuse_start(e.event.correlation_id)
            if not isinstance(exc, Exception):
                raise
            return
        self._check(group, chosen, result.items, result.report, result.has_more)

    def _check(
        self,
        group: _Group,
        chosen: list[events.LoggedEvent],
        items: Sequence[object],
        report: Sequence[events.LoggedEvent],
        has_more: bool,
    ) -> None:
        if has_more:
            self.repair = True  # an incomplete report: the reload reads what it left out
        clean = not self.needs_attention and len(chosen) == len(group.events)
        committed: list[events.LoggedEvent] = []
        for below in report:
            hazard = run_ahead_hazard(below.event, inline_steps=self.inline.ran)
            if hazard is not None:
                self._stop(
                    f"hazard below a speculative write at slot {below.slot}: {hazard}",
                    hazard=True,
                )
            else:
                self.repair = True
            clean = False
        for predicted, item in zip(chosen, items, strict=True):
            error = getattr(item, "error", None)
            logged = getattr(item, "event", None)
            cid = predicted.event.correlation_id or ""
            if logged is None:
                self._stop(f"speculative {predicted.event.type} of {cid} refused: {error}")
                if isinstance(predicted.event, events.StepStarted):
                    self._refuse_start(cid)
                clean = False
                continue
            assert isinstance(logged, events.LoggedEvent)
            committed.append(logged)
            if isinstance(logged.event, events.StepStarted):
                self._uncommitted_starts.discard(cid)
                self._settle_gate(cid, True)
                call = group.deferred.pop(cid, None)
                if call is not None:
                    self.inline.start_committed(call)
            if logged.created_at != group.at:
                _off_for_worlds.add(id(self.rt.world))
                self.enabled = False
                self._stop(
                    f"the World stored {logged.event.type} at {logged.created_at.isoformat()}, "
                    f"not its occurred_at {group.at.isoformat()}; run-ahead is off for it"
                )
                clean = False
            elif logged.event != predicted.event:
                # The workflow consumed what was written; the log holds something else.
                self._stop(f"the World stored {logged.event.type} at slot {logged.slot} other "
                           "than it was written")  # fmt: skip
                clean = False
            elif logged.slot != predicted.slot:
                self.repair = True
                clean = False
        if clean:
            self.session.confirm(committed)
            if self._open is None and not self._queue:
                self.session.end_speculation()

    def _still_allowed(self, event: events.Event) -> bool:
        return (
            isinstance(event, OUTCOMES)
            and event.correlation_id not in self._uncommitted_starts
            and event.correlation_id not in self._refused_starts
        )

    def _refuse_start(self, step_id: str) -> None:
        """A speculative creation that never committed: its running body's outcome is not
        written, and the restarted pass runs it again (counted)."""
        self._settle_gate(step_id, False)
        if step_id in self._refused_starts:
            return
        self._refused_starts.add(step_id)
        tasks = self.inline.tasks_of(step_id)
        self._orphans.update(tasks)
        if step_id in self.inline.ran:
            STATS.bodies_at_risk += 1

    def _stop(self, reason: str, *, hazard: bool = False) -> None:
        if self.stop is None:
            self.stop = reason
            STATS.stops += 1
        self._hazard = self._hazard or hazard

    # -- the delivery's side: draining, repairing, restarting --------------------------

    async def before_acting(self, outcome: engine.Outcome) -> bool:
        """Right after a pass's ``advance``: an end is judged on the committed log only
        (drained first), and the pass's workflow ``attr_set`` decisions are written
        in-band, never speculatively (``orchestrator.attributes``); True: run the pass
        again (the delivery replayed, or attributes were written)."""
        if not isinstance(outcome, engine.Suspended) and await self.drain():
            return True
        return await attribute_writes.write_pending(self.session, self.drain, outcome)

    async def drain(self) -> bool:
        """Let every speculative write commit, then repair or restart if needed; True
        when the delivery replayed (it starts a new pass)."""
        if self.speculating:
            self._draining = True
            try:
                while self._open is not None or self._busy():
                    self.kick()
                    if self._pump is not None and not self._pump.done():
                        await asyncio.wait([self._pump])
            finally:
                self._draining = False
            self.session.end_speculation()
        return await self.attend()

    async def attend(self) -> bool:
        """At the top of a pass: act on what a committed group found. Raises what stopped
        the writer; True after a repair or a restart (a new pass replays)."""
        if not self.needs_attention:
            if self.speculating and self._waits_due():
                return await self.drain()  # a wait to complete: judge the log first
            return False
        if self._open is not None or self._busy():
            return await self.drain()
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure
        if self.stop is not None:
            await self._restart()
            return True
        self.repair = False
        STATS.repairs += 1
        log.info("run %s: another writer's event landed below run-ahead; replaying", self.run_id)
        await self.session.load(keep_writer=True)
        assert self.session.writer is not None
        self.session.writer.hold_through(self.session.tail)
        self.session.start_replay(self.rt.workflows[self.session.state.workflow_name])
        return True

    async def _restart(self) -> None:
        reason, self.stop = self.stop, None
        if self._hazard:
            # Detected after the fact: decisions made without the event may have committed
            # with it (seed 003 "Recovering from a run-ahead stop").
            log.error(
                "run %s: run-ahead stopped (%s); restarting the delivery in place",
                self.run_id,
                reason,
                extra={"run_id": self.run_id, "possible_log_corruption": True},
            )
        else:
            log.warning(
                "run %s: run-ahead stopped (%s); restarting the delivery in place",
                self.run_id,
                reason,
            )
        await self.session.send_owed()
        at_risk = [s for s in self._refused_starts if s in self.inline.ran]
        STATS.most_at_risk_in_a_stop = max(STATS.most_at_risk_in_a_stop, len(at_risk))
        if self._orphans:
            # Their outcome is dropped; the restarted pass may run them again, never beside
            # a body still running (the re-run follows it, as a redelivery's would).
            await asyncio.wait(self._orphans)
        self.restarts += 1
        if self.restarts > MAX_RUN_AHEAD_RESTARTS:
            raise RunAheadRestartsSpent(
                f"run {self.run_id}: run-ahead stopped {self.restarts} times; handing off"
            )
        STATS.restarts += 1
        self.enabled = False  # for the rest of the delivery
        self.repair = False
        await self.session.load()  # a fresh writer, from the snapshot
        self.session.start_replay(self.rt.workflows[self.session.state.workflow_name])

    def _waits_due(self) -> bool:
        state = self.session.state
        return bool(decisions.due_waits(state, now_ms=now_ms(), woken=state.waits_woken()))

    async def close(self) -> None:
        """The delivery ends: never cut a write short, and never leave an outcome the
        workflow consumed unwritten."""
        self.kick()
        while self._pump is not None and not self._pump.done():
            await asyncio.wait([self._pump])
            self.kick()
        for step_id in list(self._start_gates):
            self._settle_gate(step_id, False)  # never committed by this delivery
