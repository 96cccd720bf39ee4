"""Rows of the Postgres World's tables as treadle's records and events.

JSONB comes back from asyncpg as text and is decoded here: events through the
event models (``events.parse_event``), so an event reads back equal to the one
written although JSONB reorders object keys; other payloads with ``json``.
Times are ``timestamptz`` and come back as aware datetimes, to the microsecond.

Called by ``storage`` and ``append``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import cast

from pydantic import JsonValue

from treadle.world import events, records
from treadle.worlds.postgres.database import Row

RUN_COLUMNS = (
    "run_id, workflow_name, status, deployment_id, spec_version, input, created_at, "
    "updated_at, seq, seq_in_band, started_at, completed_at, output, error, attributes, "
    "parent_run_id, parent_correlation_id"
)
STEP_COLUMNS = (
    "run_id, step_id, step_name, status, attempt, inline, created_at, updated_at, "
    "started_at, completed_at, retry_after, result, error"
)
EVENT_COLUMNS = "slot, created_at, in_band, data"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def dumps(value: JsonValue) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def to_us(moment: datetime) -> int:
    """Microseconds since the epoch (a runs.list cursor)."""
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def opt_json(value: str | None) -> JsonValue:
    return None if value is None else cast(JsonValue, json.loads(value))


def opt_error(value: str | None) -> events.ErrorInfo | None:
    return None if value is None else events.ErrorInfo.model_validate_json(value)


def event(run_id: str, row: Row, offset: int = 0) -> events.LoggedEvent:
    """A logged event from ``slot, created_at, in_band, data`` starting at ``offset``."""
    return events.LoggedEvent(
        run_id=run_id,
        slot=row[offset],
        created_at=row[offset + 1],
        in_band=row[offset + 2],
        event=events.parse_event(row[offset + 3]),
    )


def run_record(row: Row, offset: int = 0) -> records.RunRecord:
    """A run from the ``RUN_COLUMNS`` starting at ``offset``."""
    (
        run_id,
        workflow,
        status,
        deployment,
        spec,
        input_,
        created,
        updated,
        seq,
        seq_ib,
        started,
        completed,
        output,
        error,
        attributes,
    ) = (row[offset + i] for i in range(15))
    # The parent link (child workflows) is read where the row has it (``RUN_COLUMNS``);
    # treadle_create_run's answer leaves it out: ``PostgresRuns.create`` adds it.
    parent = (row[offset + 15], row[offset + 16]) if len(row) >= offset + 17 else (None, None)
    return records.RunRecord(
        run_id=run_id,
        workflow_name=workflow,
        status=cast(records.RunStatus, status),
        deployment_id=deployment,
        spec_version=spec,
        input=opt_json(input_),
        created_at=created,
        updated_at=updated,
        seq=seq,
        seq_in_band=seq_ib,
        started_at=started,
        completed_at=completed,
        output=opt_json(output),
        error=opt_error(error),
        attributes=cast(dict[str, JsonValue], json.loads(attributes)),
        parent_run_id=parent[0],
        parent_correlation_id=parent[1],
    )


def step_record(row: Row, offset: int = 0) -> records.StepRecord:
    """A step from the ``STEP_COLUMNS`` starting at ``offset``."""
    (
        run_id,
        step_id,
        name,
        status,
        attempt,
        inline,
        created,
        updated,
        started,
        completed,
        retry_after,
        result,
        error,
    ) = (row[offset + i] for i in range(13))
    return records.StepRecord(
        run_id=run_id,
        step_id=step_id,
        step_name=name,
        status=cast(records.StepStatus, status),
        attempt=attempt,
        inline=inline,
        created_at=created,
        updated_at=updated,
        started_at=started,
        completed_at=completed,
        retry_after=retry_after,
        result=opt_json(result),
        error=opt_error(error),
    )


def hook_record(row: Row) -> records.HookRecord:
    """A live hook from ``token, run_id, hook_id, created_at, metadata``."""
    return records.HookRecord(
        token=row[0],
        run_id=row[1],
        hook_id=row[2],
        created_at=row[3],
        metadata=opt_json(row[4]),
        retained_until=row[5] if len(row) > 5 else None,
    )
