"""Appends to a run's event log, on the database thread.

Each function here runs inside one SQLite transaction and decides, in this
order: the run exists; the fence (an in-band write's ``expected_seq_in_band``
against the run's ``seq_in_band``); the contract (counts present and sane);
each event's own checks (a spec 9 event on an earlier run, terminal run, a second
creation, ended step or a second outcome, an outcome of a superseded attempt, a
completed wait, live hook); then it allocates slots, inserts, folds the read views
(run status, steps, hooks) and moves the counters. A refusal raises before anything
is written, so it never leaves a hole.

``repin`` moves a run's pin (``run_repinned`` folded into the run row).

Called by ``storage.LocalEvents`` and ``storage.LocalRuns``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pydantic import JsonValue

from treadle import errors
from treadle.world import attributes as run_attributes
from treadle.world import constants, events, storagerules
from treadle.worlds.local import hookclaims
from treadle.worlds.local.database import now_us, transaction

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_us(moment: datetime) -> int:
    if moment.tzinfo is None:
        raise errors.WorldContractError(f"time {moment.isoformat()} has no timezone; use UTC")
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=value)


def dumps(value: JsonValue) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


EVENT_COLUMNS = "run_id, slot, type, correlation_id, in_band, created_at, data"


def row_to_event(row: sqlite3.Row | tuple[object, ...]) -> events.LoggedEvent:
    run_id, slot, _type, _cid, in_band, created_at, data = row
    assert isinstance(data, str)
    assert isinstance(created_at, int)
    return events.LoggedEvent(
        run_id=str(run_id),
        slot=int(str(slot)),
        created_at=from_us(created_at),
        in_band=bool(in_band),
        event=events.parse_event(data),
    )


@dataclass(slots=True)
class _Run:
    run_id: str
    status: str
    seq: int
    seq_in_band: int
    spec_version: int


@dataclass(slots=True)
class Appended:
    """What an append committed, for the async layer to wrap and publish."""

    committed: list[events.LoggedEvent]
    allocated: int
    report: list[events.LoggedEvent] = field(default_factory=list)
    has_more: bool = False
    # Per batch item: the committed event or the refusal.
    items: list[events.LoggedEvent | errors.WorldError] = field(default_factory=list)
    # Events written into other runs' logs (a force-claim's hook_disposed).
    foreign: list[events.LoggedEvent] = field(default_factory=list)


def _load_run(conn: sqlite3.Connection, run_id: str) -> _Run:
    row = conn.execute(
        "SELECT status, seq, seq_in_band, spec_version FROM runs WHERE run_id = ?", (run_id,)
    ).fetchone()
    if row is None:
        raise errors.RunNotFound(run_id)
    return _Run(run_id, row[0], row[1], row[2], row[3])


def _check_fence(
    run: _Run, *, in_band: bool, expected_seq_in_band: int | None, event_count: int | None
) -> None:
    if not in_band:
        return
    if expected_seq_in_band is None:
        raise errors.WorldContractError(
            f"run {run.run_id}: an in-band write needs expected_seq_in_band "
            "(the count from the log load's snapshot)",
            run_id=run.run_id,
        )
    if expected_seq_in_band != run.seq_in_band:
        raise errors.InBandSuperseded(
            run.run_id, expected_seq_in_band=expected_seq_in_band, seq_in_band=run.seq_in_band
        )
    if event_count is None:
        raise errors.WorldContractError(
            f"run {run.run_id}: an in-band write needs event_count "
            "(the slot its decision was made against)",
            run_id=run.run_id,
        )
    if not 0 <= event_count <= run.seq:
        raise errors.WorldContractError(
            f"run {run.run_id}: event_count {event_count} is outside the log "
            f"(slots 1..{run.seq} exist)",
            run_id=run.run_id,
            slot=event_count,
        )


def _report(
    conn: sqlite3.Connection, run: _Run, event_count: int | None
) -> tuple[list[events.LoggedEvent], bool]:
    if event_count is None or event_count >= run.seq:
        return [], False
    rows = conn.execute(
        f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id = ? AND slot > ? AND slot <= ? "
        "ORDER BY slot LIMIT ?",
        (run.run_id, event_count, run.seq, constants.MAX_SKIPPED_SLOT_REPORT + 1),
    ).fetchall()
    has_more = len(rows) > constants.MAX_SKIPPED_SLOT_REPORT
    return [row_to_event(r) for r in rows[: constants.MAX_SKIPPED_SLOT_REPORT]], has_more


def _write_foreign(
    conn: sqlite3.Connection, run_id: str, event: events.Event, foreign: list[events.LoggedEvent]
) -> events.LoggedEvent:
    """An out-of-band write into another run's log in this transaction (a force-claim)."""
    logged = _insert(
        conn, _load_run(conn, run_id), event, in_band=False, created_at=now_us(),
        idempotency_key=None,
    )  # fmt: skip
    foreign.append(logged)
    return logged


def _admit(
    conn: sqlite3.Connection,
    run: _Run,
    event: events.Event,
    foreign: list[events.LoggedEvent] | None = None,
) -> events.Event:
    """Refuse an event its run cannot take; return what to store (a hook clash turns
    into ``hook_conflict``; a force-claim's write into the holder's log joins ``foreign``)."""
    if foreign is None:
        foreign = []
    kind = event.type
    storagerules.check_event_write(run.run_id, event)
    storagerules.check_spec_event(run.run_id, run.spec_version, event)
    if run.status in ("completed", "failed", "cancelled") and kind in (
        events.REFUSED_ON_TERMINAL_RUN
    ):
        raise errors.RunExpired(run.run_id, status=run.status, event_type=kind)
    if not isinstance(event, events.StepStarted):
        _check_creation(conn, run, event)
    if isinstance(
        event, events.StepStarted | events.StepCompleted | events.StepFailed | events.StepRetrying
    ):
        # One outcome per step (DESIGN.md 10): a start or a second outcome after it is refused.
        # steps.attempt is the highest attempt started (step_created folds it to 0).
        row = conn.execute(
            "SELECT outcome_slot, attempt FROM steps WHERE run_id = ? AND step_id = ?",
            (run.run_id, event.correlation_id),
        ).fetchone()
        if row is not None and row[0] is not None and not isinstance(event, events.StepRetrying):
            raise errors.StepAlreadyEnded(
                run.run_id, step_id=event.correlation_id, outcome_slot=row[0], event_type=kind
            )
        # An outcome only from the latest started attempt (a superseded one's is stale).
        storagerules.check_outcome_attempt(run.run_id, event, None if row is None else row[1])
        if isinstance(event, events.StepStarted):
            _check_creation(conn, run, event)
        if isinstance(event, events.StepStarted) and row is not None and event.attempt <= row[1]:
            # A stale start: a later delivery already started this attempt or a later one.
            raise errors.StaleStepStart(
                run.run_id,
                step_id=event.correlation_id,
                attempt=event.attempt,
                latest_attempt=row[1],
            )
    elif isinstance(event, events.WaitCompleted):
        row = conn.execute(
            "SELECT slot FROM events WHERE run_id = ? AND correlation_id = ? "
            "AND type = 'wait_completed' LIMIT 1",
            (run.run_id, event.correlation_id),
        ).fetchone()
        if row is not None:
            raise errors.WaitAlreadyCompleted(
                run.run_id, wait_id=event.correlation_id, completed_slot=row[0]
            )
    elif isinstance(event, events.HookCreated):
        return hookclaims.claim(
            conn, run.run_id, event, now_us=now_us(),
            write_foreign=lambda rid, e: _write_foreign(conn, rid, e, foreign),
        )  # fmt: skip
    elif isinstance(event, events.HookReceived):
        # Checked before the run's status: an ended run freed its hooks (HookNotFound);
        # a retained token's row outlives its run, but takes no payload.
        live = conn.execute(
            "SELECT 1 FROM hooks WHERE run_id = ? AND hook_id = ?",
            (run.run_id, event.correlation_id),
        ).fetchone()
        if live is None or run.status in ("completed", "failed", "cancelled"):
            raise errors.HookNotFound(hook_id=event.correlation_id, run_id=run.run_id)
    return event


def _check_creation(conn: sqlite3.Connection, run: _Run, event: events.Event) -> None:
    """A second creation of the event's entity is refused (``storagerules.created_by``)."""
    kinds = storagerules.created_by(event)
    if kinds is None:
        return
    marks = ", ".join("?" * len(kinds))
    cid = event.correlation_id
    where = "correlation_id IS NULL" if cid is None else "correlation_id = ?"
    row = conn.execute(
        f"SELECT min(slot) FROM events WHERE run_id = ? AND {where} AND type IN ({marks})",
        (run.run_id, *(() if cid is None else (cid,)), *sorted(kinds)),
    ).fetchone()
    storagerules.check_creation(run.run_id, event, row[0])


def _insert(
    conn: sqlite3.Connection,
    run: _Run,
    event: events.Event,
    *,
    in_band: bool,
    created_at: int,
    idempotency_key: str | None,
) -> events.LoggedEvent:
    run.seq += 1
    if in_band:
        run.seq_in_band += 1
    conn.execute(
        "INSERT INTO events (run_id, slot, type, correlation_id, in_band, created_at, "
        "idempotency_key, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            run.run_id,
            run.seq,
            event.type,
            event.correlation_id,
            int(in_band),
            created_at,
            idempotency_key,
            event.model_dump_json(),
        ),
    )
    _fold(conn, run, event, slot=run.seq, at=created_at)
    return events.LoggedEvent(
        run_id=run.run_id,
        slot=run.seq,
        created_at=from_us(created_at),
        in_band=in_band,
        event=event,
    )


def _fold(conn: sqlite3.Connection, run: _Run, event: events.Event, *, slot: int, at: int) -> None:
    """Keep the read views (run row, steps, hooks) in step with the log."""
    rid = run.run_id
    match event:
        case events.RunStarted():
            if run.status == "pending":
                run.status = "running"
            conn.execute(
                "UPDATE runs SET status = ?, started_at = COALESCE(started_at, ?) WHERE run_id = ?",
                (run.status, at, rid),
            )
        case events.RunCompleted(output=output):
            _end_run(conn, run, "completed", at, output=dumps(output))
        case events.RunFailed(error=error):
            _end_run(conn, run, "failed", at, error=error.model_dump_json())
        case events.RunCancelled():
            _end_run(conn, run, "cancelled", at)
        case events.RunRepinned(to_deployment=target):
            conn.execute("UPDATE runs SET deployment_id = ? WHERE run_id = ?", (target, rid))
        case events.AttrSet(key=key, value=value):
            conn.execute(
                "UPDATE runs SET attributes = json_set(attributes, '$.' || json_quote(?), "
                "json(?)) WHERE run_id = ?",
                (key, dumps(value), rid),
            )
            index_attributes(conn, rid, {key: value})
        case events.StepCreated(correlation_id=sid, step_name=name, inline=inline):
            conn.execute(
                "INSERT OR IGNORE INTO steps (run_id, step_id, step_name, status, attempt, "
                "inline, created_at, updated_at) VALUES (?, ?, ?, 'created', 0, ?, ?, ?)",
                (rid, sid, name, int(inline), at, at),
            )
        case events.StepStarted(correlation_id=sid, step_name=name, attempt=attempt):
            conn.execute(
                "INSERT INTO steps (run_id, step_id, step_name, status, attempt, inline, "
                "created_at, updated_at, started_at) VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?) "
                "ON CONFLICT (run_id, step_id) DO UPDATE SET status = 'running', "
                "attempt = max(attempt, excluded.attempt), updated_at = excluded.updated_at, "
                "started_at = excluded.started_at, retry_after = NULL",
                (rid, sid, name, attempt, int(event.inline), at, at, at),
            )
        case events.StepRetrying(correlation_id=sid, error=error, retry_after=retry_after):
            conn.execute(
                "UPDATE steps SET status = 'retrying', error = ?, retry_after = ?, "
                "updated_at = ? WHERE run_id = ? AND step_id = ? AND outcome_slot IS NULL",
                (
                    error.model_dump_json(),
                    None if retry_after is None else to_us(retry_after),
                    at,
                    rid,
                    sid,
                ),
            )
        case events.StepCompleted(correlation_id=sid, step_name=name, result=result):
            _end_step(conn, rid, sid, name, "completed", slot, at, result=dumps(result))
        case events.StepFailed(correlation_id=sid, step_name=name, error=error):
            _end_step(conn, rid, sid, name, "failed", slot, at, error=error.model_dump_json())
        case events.HookCreated(correlation_id=hid, token=token, metadata=metadata):
            conn.execute(
                "INSERT INTO hooks (token, run_id, hook_id, created_at, metadata) "
                "VALUES (?, ?, ?, ?, ?)",
                (token, rid, hid, at, dumps(metadata)),
            )
            hookclaims.retain(conn, token, event.token_retention_until)
        case events.HookDisposed(correlation_id=hid) | events.HookReceived(correlation_id=hid):
            # A hook takes one payload: once it is recorded the token is free again.
            hookclaims.release(conn, rid, hid)
        case _:
            pass
    conn.execute(
        "UPDATE runs SET seq = ?, seq_in_band = ?, updated_at = ? WHERE run_id = ?",
        (run.seq, run.seq_in_band, at, rid),
    )


def _end_run(
    conn: sqlite3.Connection,
    run: _Run,
    status: str,
    at: int,
    *,
    output: str | None = None,
    error: str | None = None,
) -> None:
    run.status = status
    conn.execute(
        "UPDATE runs SET status = ?, output = ?, error = ?, completed_at = ? WHERE run_id = ?",
        (status, output, error, at, run.run_id),
    )
    # A terminal event frees every hook the run still holds, but a retained token.
    hookclaims.end_run(conn, run.run_id, at)


def _end_step(
    conn: sqlite3.Connection,
    rid: str,
    sid: str,
    name: str,
    status: str,
    slot: int,
    at: int,
    *,
    result: str | None = None,
    error: str | None = None,
) -> None:
    conn.execute(
        "INSERT INTO steps (run_id, step_id, step_name, status, attempt, inline, outcome_slot, "
        "created_at, updated_at, completed_at, result, error) "
        "VALUES (?, ?, ?, ?, 0, 0, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (run_id, step_id) DO UPDATE SET status = excluded.status, "
        "outcome_slot = excluded.outcome_slot, updated_at = excluded.updated_at, "
        "completed_at = excluded.completed_at, result = excluded.result, error = excluded.error "
        "WHERE outcome_slot IS NULL",
        (rid, sid, name, status, slot, at, at, at, result, error),
    )


@dataclass(frozen=True, slots=True)
class WriteParams:
    """How a write is made: by the orchestrator (in-band, fenced) or anyone else."""

    in_band: bool
    expected_seq_in_band: int | None = None
    event_count: int | None = None
    occurred_at: datetime | None = None

    def created_at(self) -> int:
        """An in-band write's ``occurred_at`` is stored as its time; else the World's clock."""
        if self.in_band and self.occurred_at is not None:
            return to_us(self.occurred_at)
        return now_us()


def _begin(conn: sqlite3.Connection, run_id: str, params: WriteParams) -> _Run:
    """Inside the write's transaction: the run, then the fence, decided before anything."""
    run = _load_run(conn, run_id)
    _check_fence(
        run,
        in_band=params.in_band,
        expected_seq_in_band=params.expected_seq_in_band,
        event_count=params.event_count,
    )
    return run


def append(
    conn: sqlite3.Connection,
    run_id: str,
    event: events.Event,
    params: WriteParams,
    idempotency_key: str | None,
) -> Appended:
    """One event: fence, checks, slot, fold. Runs on the database thread."""
    with transaction(conn):
        run = _begin(conn, run_id, params)
        if idempotency_key is not None:
            row = conn.execute(
                f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id = ? AND idempotency_key = ?",
                (run_id, idempotency_key),
            ).fetchone()
            if row is not None:
                return Appended(committed=[row_to_event(row)], allocated=0)
        foreign: list[events.LoggedEvent] = []
        stored = _admit(conn, run, event, foreign)
        report, has_more = _report(conn, run, params.event_count if params.in_band else None)
        logged = _insert(
            conn, run, stored, in_band=params.in_band, created_at=params.created_at(),
            idempotency_key=idempotency_key,
        )  # fmt: skip
        return Appended(
            committed=[logged], allocated=1, report=report, has_more=has_more, foreign=foreign
        )


def _check_batch(run_id: str, batch: Sequence[events.Event]) -> None:
    storagerules.check_batch(run_id, batch)


def append_batch(
    conn: sqlite3.Connection, run_id: str, batch: Sequence[events.Event], params: WriteParams
) -> Appended:
    """Step and wait events as one block under one fence check; not atomic per item."""
    _check_batch(run_id, batch)
    with transaction(conn):
        run = _begin(conn, run_id, params)
        report, has_more = _report(conn, run, params.event_count if params.in_band else None)
        at = params.created_at()
        refused: set[str] = set()
        result = Appended(committed=[], allocated=0, report=report, has_more=has_more)
        for index, item in enumerate(batch):
            cid = item.correlation_id or ""
            if cid in refused:
                result.items.append(
                    errors.EarlierItemRefused(run_id, correlation_id=cid, index=index)
                )
                continue
            try:
                stored = _admit(conn, run, item)
            except errors.WorldError as exc:
                refused.add(cid)
                result.items.append(exc)
                continue
            logged = _insert(
                conn, run, stored, in_band=params.in_band, created_at=at, idempotency_key=None
            )
            result.committed.append(logged)
            result.items.append(logged)
            result.allocated += 1
        return result


def repin(
    conn: sqlite3.Connection,
    *,
    run_id: str,
    from_deployment: str,
    to_deployment: str,
    reason: str | None,
) -> events.LoggedEvent:
    """``run_repinned`` and the run row's new deployment, in one transaction, or
    ``RunNotRepinned`` with nothing written (``storagerules.check_repin``)."""
    with transaction(conn):
        run = _load_run(conn, run_id)
        current = conn.execute(
            "SELECT deployment_id FROM runs WHERE run_id = ?", (run_id,)
        ).fetchone()[0]
        target = conn.execute(
            "SELECT retired FROM deployments WHERE deployment_id = ?", (to_deployment,)
        ).fetchone()
        storagerules.check_repin(
            run_id, status=run.status, current=str(current), from_deployment=from_deployment,
            to_deployment=to_deployment, target_retired=None if target is None else bool(target[0]),
        )  # fmt: skip
        event = events.RunRepinned(
            from_deployment=from_deployment, to_deployment=to_deployment, reason=reason
        )
        return _insert(conn, run, event, in_band=False, created_at=now_us(), idempotency_key=None)


def index_attributes(conn: sqlite3.Connection, run_id: str, values: dict[str, JsonValue]) -> None:
    """Keep ``run_attributes`` (what ``runs.list(attributes=...)`` reads) in step: a
    searchable value replaces the key's row, any other value removes it."""
    for key, value in values.items():
        text = run_attributes.canonical(value)
        if text is None:
            conn.execute("DELETE FROM run_attributes WHERE run_id = ? AND key = ?", (run_id, key))
        else:
            conn.execute(
                "INSERT OR REPLACE INTO run_attributes (run_id, key, value) VALUES (?, ?, ?)",
                (run_id, key, text),
            )


def create_run(
    conn: sqlite3.Connection,
    *,
    run_id: str,
    workflow_name: str,
    input: JsonValue,
    deployment_id: str,
    spec_version: int,
    attributes: dict[str, JsonValue],
    parent: tuple[str | None, str | None] = (None, None),
) -> tuple[bool, events.LoggedEvent]:
    """Insert the run row and ``run_created`` at slot 1; converge on a retried create.

    Returns (created, the run_created event).
    """
    created = events.RunCreated(
        workflow_name=workflow_name,
        input=input,
        deployment_id=deployment_id,
        spec_version=spec_version,
        attributes=attributes,
        parent_run_id=parent[0],
        parent_correlation_id=parent[1],
    )
    with transaction(conn):
        row = conn.execute(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id = ? AND slot = 1", (run_id,)
        ).fetchone()
        if row is not None:
            existing = row_to_event(row)
            held = existing.event
            assert isinstance(held, events.RunCreated)
            storagerules.check_same_run(
                run_id, held, workflow_name=workflow_name, input=input,
                deployment_id=deployment_id,
            )  # fmt: skip
            return False, existing
        # Checked in the transaction that inserts: a retire is before or after it (R1).
        retired = conn.execute(
            "SELECT retired FROM deployments WHERE deployment_id = ?", (deployment_id,)
        ).fetchone()
        if retired is not None and retired[0]:
            raise errors.DeploymentRetired(deployment_id, run_id)
        at = now_us()
        conn.execute(
            "INSERT INTO runs (run_id, workflow_name, deployment_id, spec_version, status, "
            "input, attributes, seq, seq_in_band, created_at, updated_at, parent_run_id, "
            "parent_correlation_id) VALUES (?, ?, ?, ?, 'pending', ?, ?, 1, ?, ?, ?, ?, ?)",
            (
                run_id,
                workflow_name,
                deployment_id,
                spec_version,
                dumps(input),
                dumps(attributes),
                constants.IN_BAND_SEQ_AT_RUN_CREATION,
                at,
                at,
                parent[0],
                parent[1],
            ),
        )
        conn.execute(
            "INSERT INTO events (run_id, slot, type, correlation_id, in_band, created_at, data) "
            "VALUES (?, 1, 'run_created', NULL, 1, ?, ?)",
            (run_id, at, created.model_dump_json()),
        )
        index_attributes(conn, run_id, attributes)
        return True, events.LoggedEvent(
            run_id=run_id, slot=1, created_at=from_us(at), in_band=True, event=created
        )
