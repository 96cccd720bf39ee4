"""Appends to a run's log: one call of ``treadle_append`` per write, one round trip.

The server-side function (``migrations/0001_init.sql``) locks the run's row,
decides the fence, the contract and each event's checks, allocates slots,
inserts, folds the read views, moves the counters and NOTIFYs, all in the one
statement's transaction; a refusal raises before anything is written, so it
never leaves a hole. This module builds the call and turns its rows into an
``EventResult`` or a ``BatchResult``; the checks it makes itself (a batch's
shape, times without a timezone) are the ones the local World makes before its
transaction.

Called by ``storage.PostgresEvents``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from treadle import errors
from treadle.world import constants, events, records, storagerules
from treadle.worlds.postgres import rows as rowmod
from treadle.worlds.postgres import sqlerrors
from treadle.worlds.postgres.database import Database, Row

APPEND_SQL = "SELECT * FROM treadle_append($1, $2::jsonb[], $3, $4, $5, $6, $7, $8, $9)"
# A hook_created with ``force`` (migration 0012: the holder's disposal in the same statement).
CLAIM_SQL = "SELECT * FROM treadle_append_claim($1, $2::jsonb[], $3, $4, $5, $6, $7, $8, $9)"
# Out-of-band events.create calls of one run in one statement (migration 0011).
GROUP_SQL = "SELECT * FROM treadle_append_group($1, $2::jsonb[])"
# One more than the report holds: a full report plus one means has_more.
_REPORT_FETCH = constants.MAX_SKIPPED_SLOT_REPORT + 1


@dataclass(frozen=True, slots=True)
class WriteParams:
    """How a write is made: by the orchestrator (in-band, fenced) or anyone else."""

    in_band: bool
    expected_seq_in_band: int | None = None
    event_count: int | None = None
    occurred_at: datetime | None = None


@dataclass(slots=True)
class Appended:
    """What an append committed."""

    committed: list[events.LoggedEvent] = field(default_factory=list)
    allocated: int = 0
    report: list[events.LoggedEvent] = field(default_factory=list)
    has_more: bool = False
    items: list[events.LoggedEvent | errors.WorldError] = field(default_factory=list)


def _no_naive(moment: datetime | None) -> None:
    if moment is not None and moment.tzinfo is None:
        raise errors.WorldContractError(f"time {moment.isoformat()} has no timezone; use UTC")


def check_out_of_band_times(event: events.Event) -> None:
    """What ``append`` checks of an out-of-band event before it is sent (a naive time)."""
    _check_times([event], WriteParams(in_band=False))


def _check_times(batch: Sequence[events.Event], params: WriteParams) -> None:
    if params.in_band:
        _no_naive(params.occurred_at)
    for item in batch:
        if isinstance(item, events.StepRetrying):
            _no_naive(item.retry_after)


def check_batch(run_id: str, batch: Sequence[events.Event]) -> None:
    """A batch holds 1..MAX_BATCH_EVENTS step and wait events (else refused whole)."""
    storagerules.check_batch(run_id, batch)


async def append(
    db: Database,
    run_id: str,
    batch: Sequence[events.Event],
    params: WriteParams,
    *,
    is_batch: bool,
    idempotency_key: str | None = None,
    first: bool = False,
) -> Appended:
    """Write ``batch`` (one event for ``events.create``) in one statement; ``first``: ahead
    of the calls waiting for a connection (``Database.fetch_first``)."""
    _check_times(batch, params)
    payload = [item.model_dump_json() for item in batch]
    forced = len(batch) == 1 and isinstance(batch[0], events.HookCreated) and batch[0].force
    result = await (db.fetch_first if first else db.fetch)(
        CLAIM_SQL if forced else APPEND_SQL,
        run_id,
        payload,
        params.in_band,
        params.expected_seq_in_band,
        params.event_count,
        params.occurred_at if params.in_band else None,
        idempotency_key,
        is_batch,
        _REPORT_FETCH,
    )
    return _decode(run_id, batch, result)


def _decode(run_id: str, batch: Sequence[events.Event], result: list[Row]) -> Appended:
    appended = Appended()
    for row in result:
        kind = row[0]
        if kind == "event":
            sent = batch[row[1]]
            logged = events.LoggedEvent(
                run_id=run_id,
                slot=row[2],
                created_at=row[3],
                in_band=row[4],
                event=sent if row[5] is None else events.parse_event(row[5]),
            )
            appended.committed.append(logged)
            appended.items.append(logged)
            appended.allocated += 1
        elif kind == "refused":
            appended.items.append(sqlerrors.world_error(row[6], row[7], row[8]))
        elif kind == "report":
            appended.report.append(rowmod.event(run_id, row, 2))
        elif kind == "existing":
            appended.committed.append(rowmod.event(run_id, row, 2))
    if len(appended.report) > constants.MAX_SKIPPED_SLOT_REPORT:
        del appended.report[constants.MAX_SKIPPED_SLOT_REPORT :]
        appended.has_more = True
    return appended


async def create(
    db: Database,
    run_id: str,
    event: events.Event,
    params: WriteParams,
    idempotency_key: str | None,
    *,
    first: bool = False,
) -> records.EventResult:
    appended = await append(
        db, run_id, [event], params, is_batch=False, idempotency_key=idempotency_key, first=first
    )
    if not appended.committed:  # a single write either commits, converges or raises
        raise errors.StorageUnavailable(f"run {run_id}: the append returned no event")
    return records.EventResult(
        event=appended.committed[0],
        allocated=appended.allocated,
        report=tuple(appended.report),
        has_more=appended.has_more,
    )


async def create_group(
    db: Database, run_id: str, group: Sequence[events.Event], payload: Sequence[str]
) -> list[records.EventResult | errors.WorldError]:
    """Out-of-band ``events.create`` calls of one run in one statement, each answered as if
    written alone: its ``EventResult`` or its refusal. ``payload`` holds each event's JSON.
    Raises (for the whole group) when the statement fails."""
    result = await db.fetch_first(GROUP_SQL, run_id, list(payload))
    answers: list[records.EventResult | errors.WorldError | None] = [None] * len(group)
    for row in result:
        index = row[1]
        if row[0] == "event":
            sent = group[index]
            logged = events.LoggedEvent(
                run_id=run_id,
                slot=row[2],
                created_at=row[3],
                in_band=False,
                event=sent if row[4] is None else events.parse_event(row[4]),
            )
            answers[index] = records.EventResult(event=logged, allocated=1)
        else:
            answers[index] = sqlerrors.world_error(row[5], row[6], row[7])
    return [
        errors.StorageUnavailable(f"run {run_id}: the grouped append returned no answer")
        if answer is None
        else answer
        for answer in answers
    ]


async def create_batch(
    db: Database, run_id: str, batch: Sequence[events.Event], params: WriteParams
) -> tuple[records.BatchResult, list[events.LoggedEvent]]:
    """The batch's result and the events it committed."""
    check_batch(run_id, batch)
    appended = await append(db, run_id, list(batch), params, is_batch=True)
    items = tuple(
        records.BatchItemResult(error=item)
        if isinstance(item, errors.WorldError)
        else records.BatchItemResult(event=item)
        for item in appended.items
    )
    result = records.BatchResult(
        items=items,
        allocated=appended.allocated,
        report=tuple(appended.report),
        has_more=appended.has_more,
    )
    return result, appended.committed
