"""The in-memory World's storage state and its write rules: runs, logs, steps, hooks.

``Store`` holds every run's log and the read views folded from it. Each write
is one synchronous call, so on one event loop it is atomic; it decides in the
local World's order (``treadle.worlds.local.eventlog``): the run exists; the
fence; the counts; each event's own checks (a spec 9 event on an earlier run, terminal
run, a second creation, ended step or a second outcome, a stale step start, completed
wait, live hook; a hook_received also frees
its token); then it allocates slots, stores, folds the views and moves the counters.
A refusal raises before anything is stored, so it never leaves a hole.

Events are stored as their JSON text and read back as fresh objects, so neither a
writer nor a reader can change what the log holds (as with a real database).

Called by ``storage`` (the async facades) and ``backend.MemoryBackend``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from pydantic import JsonValue

from treadle import clock, errors
from treadle.world import constants, events, records, storagerules

_TERMINAL = frozenset({"completed", "failed", "cancelled"})


def frozen_json(value: JsonValue) -> JsonValue:
    """A private copy of a JSON value (checked to be JSON)."""
    return json.loads(json.dumps(value))  # type: ignore[no-any-return]


@dataclass(slots=True)
class Stored:
    """One event of a log: what readers get a fresh copy of, and its text."""

    logged: events.LoggedEvent
    text: str

    def read(self) -> events.LoggedEvent:
        return events.LoggedEvent.model_validate_json(self.text)


@dataclass(slots=True)
class RunState:
    """One run: its row (a ``RunRecord`` kept current), log, steps and hook ids."""

    record: records.RunRecord
    log: list[Stored] = field(default_factory=list)
    # correlation id -> its events, in slot order (``events.list_entity``).
    by_entity: dict[str, list[Stored]] = field(default_factory=dict)
    keys: dict[str, Stored] = field(default_factory=dict)
    steps: dict[str, records.StepRecord] = field(default_factory=dict)
    outcome_slots: dict[str, int] = field(default_factory=dict)
    completed_waits: dict[str, int] = field(default_factory=dict)
    hooks: dict[str, str] = field(default_factory=dict)  # hook id -> token
    # (type, correlation id) -> the first slot, for storagerules.CREATION_LOOKUP_TYPES.
    creations: dict[tuple[str, str | None], int] = field(default_factory=dict)

    def first_creation(self, event: events.Event) -> int | None:
        """The slot of the earliest event that makes ``event`` a second creation."""
        kinds = storagerules.created_by(event)
        if kinds is None:
            return None
        slots = [
            slot
            for kind in kinds
            if (slot := self.creations.get((kind, event.correlation_id))) is not None
        ]
        return min(slots, default=None)

    @property
    def run_id(self) -> str:
        return self.record.run_id


@dataclass(frozen=True, slots=True)
class WriteParams:
    """How a write is made: by the orchestrator (in-band, fenced) or anyone else."""

    in_band: bool
    expected_seq_in_band: int | None = None
    event_count: int | None = None
    occurred_at: datetime | None = None

    def created_at(self) -> datetime:
        """An in-band write's ``occurred_at`` is stored as its time; else the World's clock."""
        if self.in_band and self.occurred_at is not None:
            if self.occurred_at.tzinfo is None:
                raise errors.WorldContractError(
                    f"time {self.occurred_at.isoformat()} has no timezone; use UTC"
                )
            return self.occurred_at
        return clock.utcnow()


class Store:
    """Every run of one World, and the live hooks by token."""

    def __init__(self) -> None:
        self.runs: dict[str, RunState] = {}
        self.hooks: dict[str, records.HookRecord] = {}
        # Runs written to by a force-claim of another run's write (their feeds to wake).
        self.foreign: list[str] = []

    def run(self, run_id: str) -> RunState:
        state = self.runs.get(run_id)
        if state is None:
            raise errors.RunNotFound(run_id)
        return state

    # -- runs.create ---------------------------------------------------------------------

    def create_run(
        self,
        *,
        run_id: str,
        workflow_name: str,
        input: JsonValue,
        deployment_id: str,
        spec_version: int,
        attributes: dict[str, JsonValue],
        parent: tuple[str | None, str | None] = (None, None),
    ) -> tuple[bool, RunState]:
        """The run row and ``run_created`` at slot 1; converge on a retried create."""
        created = events.RunCreated(
            workflow_name=workflow_name,
            input=frozen_json(input),
            deployment_id=deployment_id,
            spec_version=spec_version,
            attributes=dict(attributes),
            parent_run_id=parent[0],
            parent_correlation_id=parent[1],
        )
        held = self.runs.get(run_id)
        if held is not None:
            first = held.log[0].logged.event
            assert isinstance(first, events.RunCreated)
            storagerules.check_same_run(
                run_id, first, workflow_name=workflow_name, input=input,
                deployment_id=deployment_id,
            )  # fmt: skip
            return False, held
        at = clock.utcnow()
        record = records.RunRecord(
            run_id=run_id,
            workflow_name=workflow_name,
            status="pending",
            deployment_id=deployment_id,
            spec_version=spec_version,
            input=created.input,
            created_at=at,
            updated_at=at,
            seq=1,
            seq_in_band=constants.IN_BAND_SEQ_AT_RUN_CREATION,
            attributes=frozen_json(dict(attributes)),  # type: ignore[arg-type]
            parent_run_id=parent[0],
            parent_correlation_id=parent[1],
        )
        state = RunState(record)
        logged = events.LoggedEvent(
            run_id=run_id, slot=1, created_at=at, in_band=True, event=created
        )
        state.log.append(Stored(logged, logged.model_dump_json()))
        self.runs[run_id] = state
        return True, state

    # -- runs.repin ----------------------------------------------------------------------

    def repin(
        self,
        run_id: str,
        *,
        from_deployment: str,
        to_deployment: str,
        reason: str | None,
        target: records.DeploymentRecord | None,
    ) -> events.LoggedEvent:
        """``run_repinned`` and the run row's new deployment, or ``RunNotRepinned``."""
        state = self.run(run_id)
        storagerules.check_repin(
            run_id, status=state.record.status, current=state.record.deployment_id,
            from_deployment=from_deployment, to_deployment=to_deployment,
            target_retired=None if target is None else target.retired,
        )  # fmt: skip
        event = events.RunRepinned(
            from_deployment=from_deployment, to_deployment=to_deployment, reason=reason
        )
        return self._insert(state, event, False, clock.utcnow(), None)

    # -- events.create / create_batch ----------------------------------------------------

    def append(
        self, run_id: str, event: events.Event, params: WriteParams, idempotency_key: str | None
    ) -> tuple[list[events.LoggedEvent], int, list[events.LoggedEvent], bool]:
        """One event: (committed, allocated, report, has_more)."""
        state = self._begin(run_id, params)
        if idempotency_key is not None and idempotency_key in state.keys:
            return [state.keys[idempotency_key].read()], 0, [], False
        stored = self._admit(state, event)
        report, has_more = self._report(state, params)
        logged = self._insert(state, stored, params.in_band, params.created_at(), idempotency_key)
        return [logged], 1, report, has_more

    def append_batch(
        self, run_id: str, batch: Sequence[events.Event], params: WriteParams
    ) -> tuple[list[events.LoggedEvent | errors.WorldError], int, list[events.LoggedEvent], bool]:
        """Step and wait events as one block under one fence check; not atomic per item."""
        storagerules.check_batch(run_id, batch)
        state = self._begin(run_id, params)
        report, has_more = self._report(state, params)
        at = params.created_at()
        refused: set[str] = set()
        items: list[events.LoggedEvent | errors.WorldError] = []
        allocated = 0
        for index, item in enumerate(batch):
            cid = item.correlation_id or ""
            if cid in refused:
                items.append(errors.EarlierItemRefused(run_id, correlation_id=cid, index=index))
                continue
            try:
                stored = self._admit(state, item)
            except errors.WorldError as exc:
                refused.add(cid)
                items.append(exc)
                continue
            items.append(self._insert(state, stored, params.in_band, at, None))
            allocated += 1
        return items, allocated, report, has_more

    def _begin(self, run_id: str, params: WriteParams) -> RunState:
        """The run, then the fence, decided before anything."""
        state = self.run(run_id)
        run = state.record
        if not params.in_band:
            return state
        if params.expected_seq_in_band is None:
            raise errors.WorldContractError(
                f"run {run_id}: an in-band write needs expected_seq_in_band "
                "(the count from the log load's snapshot)",
                run_id=run_id,
            )
        if params.expected_seq_in_band != run.seq_in_band:
            raise errors.InBandSuperseded(
                run_id,
                expected_seq_in_band=params.expected_seq_in_band,
                seq_in_band=run.seq_in_band,
            )
        count = params.event_count
        if count is None:
            raise errors.WorldContractError(
                f"run {run_id}: an in-band write needs event_count "
                "(the slot its decision was made against)",
                run_id=run_id,
            )
        if not 0 <= count <= run.seq:
            raise errors.WorldContractError(
                f"run {run_id}: event_count {count} is outside the log (slots 1..{run.seq} exist)",
                run_id=run_id,
                slot=count,
            )
        return state

    def _report(
        self, state: RunState, params: WriteParams
    ) -> tuple[list[events.LoggedEvent], bool]:
        count = params.event_count
        if not params.in_band or count is None or count >= state.record.seq:
            return [], False
        skipped = state.log[count:]
        limit = constants.MAX_SKIPPED_SLOT_REPORT
        return [s.read() for s in skipped[:limit]], len(skipped) > limit

    def _admit(self, state: RunState, event: events.Event) -> events.Event:
        """Refuse an event its run cannot take; return what to store (a hook clash turns
        into ``hook_conflict``)."""
        run_id, kind = state.run_id, event.type
        storagerules.check_event_write(run_id, event)
        storagerules.check_spec_event(run_id, state.record.spec_version, event)
        if state.record.status in _TERMINAL and kind in events.REFUSED_ON_TERMINAL_RUN:
            raise errors.RunExpired(run_id, status=state.record.status, event_type=kind)
        if not isinstance(event, events.StepStarted):
            storagerules.check_creation(run_id, event, state.first_creation(event))
        match event:
            case (
                events.StepStarted()
                | events.StepCompleted()
                | events.StepFailed()
                | events.StepRetrying()
            ):
                ended = state.outcome_slots.get(event.correlation_id)
                if ended is not None and not isinstance(event, events.StepRetrying):
                    raise errors.StepAlreadyEnded(
                        run_id, step_id=event.correlation_id, outcome_slot=ended, event_type=kind
                    )
                if isinstance(event, events.StepStarted):
                    storagerules.check_creation(run_id, event, state.first_creation(event))
                held = state.steps.get(event.correlation_id)
                # An outcome only from the latest started attempt (a superseded one's is stale).
                storagerules.check_outcome_attempt(
                    run_id, event, None if held is None else held.attempt
                )
                if (
                    isinstance(event, events.StepStarted)
                    and held is not None
                    and event.attempt <= held.attempt
                ):
                    # A stale start: a later delivery already started this attempt or a later one.
                    raise errors.StaleStepStart(
                        run_id,
                        step_id=event.correlation_id,
                        attempt=event.attempt,
                        latest_attempt=held.attempt,
                    )
            case events.WaitCompleted():
                done = state.completed_waits.get(event.correlation_id)
                if done is not None:
                    raise errors.WaitAlreadyCompleted(
                        run_id, wait_id=event.correlation_id, completed_slot=done
                    )
            case events.HookCreated():
                return self._claim(state, event)
            case events.HookReceived():
                if event.correlation_id not in state.hooks:
                    raise errors.HookNotFound(hook_id=event.correlation_id, run_id=run_id)
            case _:
                pass
        return event

    def _claim(self, state: RunState, event: events.HookCreated) -> events.Event:
        """A creation's token claim (``storagerules.claim_decision``): free, conflict, or
        force-claimed from its holder (``hook_disposed`` into the holder's log)."""
        holder = self.hooks.get(event.token)
        if holder is not None:
            held = self.runs[holder.run_id].record
            if storagerules.holder_expired(
                run_ended=held.status in _TERMINAL,
                retained_until=holder.retained_until,
                now=clock.utcnow(),
            ):
                del self.hooks[event.token]
                holder = None
        decision = storagerules.claim_decision(
            state.run_id, event, None if holder is None else holder.run_id
        )
        if holder is None or decision == "create":
            return event
        if decision == "conflict":
            return storagerules.conflict(event, holder.run_id)
        victim = self.runs[holder.run_id]
        del self.hooks[event.token]
        victim.hooks.pop(holder.hook_id, None)
        disposal = storagerules.forced_disposal(holder.hook_id, state.run_id)
        self._insert(victim, disposal, False, clock.utcnow(), None)
        self.foreign.append(victim.run_id)
        return storagerules.claimed(event, victim.run_id)

    def _insert(
        self,
        state: RunState,
        event: events.Event,
        in_band: bool,
        at: datetime,
        idempotency_key: str | None,
    ) -> events.LoggedEvent:
        run = state.record
        slot = run.seq + 1
        logged = events.LoggedEvent(
            run_id=run.run_id, slot=slot, created_at=at, in_band=in_band, event=event
        )
        text = logged.model_dump_json()
        stored = Stored(events.LoggedEvent.model_validate_json(text), text)
        state.log.append(stored)
        if event.correlation_id is not None:
            state.by_entity.setdefault(event.correlation_id, []).append(stored)
        if idempotency_key is not None:
            state.keys[idempotency_key] = stored
        if event.type in storagerules.CREATION_LOOKUP_TYPES:
            state.creations.setdefault((event.type, event.correlation_id), slot)
        state.record = replace(
            run, seq=slot, seq_in_band=run.seq_in_band + int(in_band), updated_at=clock.utcnow()
        )
        self._fold(state, stored.logged.event, slot, at)
        return stored.read()

    def _fold(self, state: RunState, event: events.Event, slot: int, at: datetime) -> None:
        """Keep the read views (run row, steps, hooks) in step with the log."""
        run = state.record
        match event:
            case events.RunStarted():
                status = "running" if run.status == "pending" else run.status
                state.record = replace(run, status=status, started_at=run.started_at or at)
            case events.RunCompleted(output=output):
                self._end_run(state, replace(run, status="completed", output=output), at)
            case events.RunFailed(error=error):
                self._end_run(state, replace(run, status="failed", error=error), at)
            case events.RunCancelled():
                self._end_run(state, replace(run, status="cancelled"), at)
            case events.RunRepinned(to_deployment=target):
                state.record = replace(run, deployment_id=target)
            case events.AttrSet(key=key, value=value):
                attributes = {**run.attributes, key: copy.deepcopy(value)}
                state.record = replace(run, attributes=attributes)
            case events.StepCreated(correlation_id=sid, step_name=name, inline=inline):
                if sid not in state.steps:
                    state.steps[sid] = records.StepRecord(
                        run_id=run.run_id, step_id=sid, step_name=name, status="created",
                        attempt=0, inline=inline, created_at=at, updated_at=at,
                    )  # fmt: skip
            case events.StepStarted(correlation_id=sid, step_name=name, attempt=attempt):
                held = state.steps.get(sid)
                if held is None:
                    held = records.StepRecord(
                        run_id=run.run_id, step_id=sid, step_name=name, status="running",
                        attempt=attempt, inline=event.inline, created_at=at, updated_at=at,
                    )  # fmt: skip
                state.steps[sid] = replace(
                    held, status="running", attempt=max(held.attempt, attempt), updated_at=at,
                    started_at=at, retry_after=None,
                )  # fmt: skip
            case events.StepRetrying(correlation_id=sid, error=error, retry_after=retry_after):
                held = state.steps.get(sid)
                if held is not None and sid not in state.outcome_slots:
                    state.steps[sid] = replace(
                        held, status="retrying", error=error, retry_after=retry_after,
                        updated_at=at,
                    )  # fmt: skip
            case events.StepCompleted(correlation_id=sid, step_name=name, result=result):
                self._end_step(state, sid, name, slot, at, result=result)
            case events.StepFailed(correlation_id=sid, step_name=name, error=error):
                self._end_step(state, sid, name, slot, at, error=error)
            case events.WaitCompleted(correlation_id=wid):
                state.completed_waits[wid] = slot
            case events.HookCreated(correlation_id=hid, token=token, metadata=metadata):
                self.hooks[token] = records.HookRecord(
                    token=token, run_id=run.run_id, hook_id=hid, created_at=at, metadata=metadata,
                    retained_until=event.token_retention_until,
                )  # fmt: skip
                state.hooks[hid] = token
            case events.HookDisposed(correlation_id=hid) | events.HookReceived(correlation_id=hid):
                # A hook takes one payload: once it is recorded the token is free again.
                held_token = state.hooks.pop(hid, None)
                if held_token is not None:
                    self.hooks.pop(held_token, None)
            case _:
                pass

    def _end_run(self, state: RunState, ended: records.RunRecord, at: datetime) -> None:
        state.record = replace(ended, completed_at=at)
        # A terminal event frees every hook the run still holds but a retained one.
        for token in state.hooks.values():
            held = self.hooks.get(token)
            if held is None or held.retained_until is None or held.retained_until <= at:
                self.hooks.pop(token, None)
        state.hooks.clear()

    def _end_step(
        self,
        state: RunState,
        sid: str,
        name: str,
        slot: int,
        at: datetime,
        *,
        result: JsonValue = None,
        error: events.ErrorInfo | None = None,
    ) -> None:
        held = state.steps.get(sid) or records.StepRecord(
            run_id=state.run_id, step_id=sid, step_name=name, status="created", attempt=0,
            inline=False, created_at=at, updated_at=at,
        )  # fmt: skip
        state.steps[sid] = replace(
            held, status="failed" if error is not None else "completed", updated_at=at,
            completed_at=at, result=result, error=error,
        )  # fmt: skip
        state.outcome_slots[sid] = slot
