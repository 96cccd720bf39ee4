"""The local World's storage half: runs, events, steps and hooks over SQLite.

Writes go through ``eventlog`` on the database thread; reads are single
queries there too, so a page's snapshot and its events come from one
consistent state. Called through ``LocalWorld``.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import cast

from pydantic import JsonValue

from treadle import errors
from treadle.world import attributes as run_attributes
from treadle.world import contract, events, ids, records, storagerules
from treadle.worlds.local import eventlog
from treadle.worlds.local.database import Database, now_us, transaction
from treadle.worlds.local.eventlog import EVENT_COLUMNS, from_us, row_to_event
from treadle.worlds.local.feed import Feed, Subscription

_RUN_COLUMNS = (
    "run_id, workflow_name, status, deployment_id, spec_version, input, created_at, "
    "updated_at, seq, seq_in_band, started_at, completed_at, output, error, attributes, "
    "parent_run_id, parent_correlation_id"
)
_STEP_COLUMNS = (
    "run_id, step_id, step_name, status, attempt, inline, created_at, updated_at, "
    "started_at, completed_at, retry_after, result, error"
)


def _opt_time(value: int | None) -> datetime | None:
    return None if value is None else from_us(value)


def _opt_error(value: str | None) -> events.ErrorInfo | None:
    return None if value is None else events.ErrorInfo.model_validate_json(value)


def _opt_json(value: str | None) -> JsonValue:
    return None if value is None else cast(JsonValue, json.loads(value))


def _run_record(row: tuple[object, ...]) -> records.RunRecord:
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
        parent_run_id,
        parent_cid,
    ) = row
    return records.RunRecord(
        run_id=str(run_id),
        workflow_name=str(workflow),
        status=cast(records.RunStatus, status),
        deployment_id=str(deployment),
        spec_version=cast(int, spec),
        input=_opt_json(cast(str, input_)),
        created_at=from_us(cast(int, created)),
        updated_at=from_us(cast(int, updated)),
        seq=cast(int, seq),
        seq_in_band=cast(int, seq_ib),
        started_at=_opt_time(cast(int | None, started)),
        completed_at=_opt_time(cast(int | None, completed)),
        output=_opt_json(cast(str | None, output)),
        error=_opt_error(cast(str | None, error)),
        attributes=cast(dict[str, JsonValue], json.loads(cast(str, attributes))),
        parent_run_id=cast(str | None, parent_run_id),
        parent_correlation_id=cast(str | None, parent_cid),
    )


def _step_record(row: tuple[object, ...]) -> records.StepRecord:
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
    ) = row
    return records.StepRecord(
        run_id=str(run_id),
        step_id=str(step_id),
        step_name=str(name),
        status=cast(records.StepStatus, status),
        attempt=cast(int, attempt),
        inline=bool(inline),
        created_at=from_us(cast(int, created)),
        updated_at=from_us(cast(int, updated)),
        started_at=_opt_time(cast(int | None, started)),
        completed_at=_opt_time(cast(int | None, completed)),
        retry_after=_opt_time(cast(int | None, retry_after)),
        result=_opt_json(cast(str | None, result)),
        error=_opt_error(cast(str | None, error)),
    )


def _get_run(conn: sqlite3.Connection, run_id: str) -> records.RunRecord:
    row = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    if row is None:
        raise errors.RunNotFound(run_id)
    return _run_record(row)


def _list_runs(
    conn: sqlite3.Connection, where: list[str], params: list[object], limit: int
) -> list[tuple[object, ...]]:
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    return conn.execute(
        f"SELECT {_RUN_COLUMNS} FROM runs {clause} ORDER BY created_at DESC, run_id DESC LIMIT ?",
        (*params, limit + 1),
    ).fetchall()


def _count_runs(
    conn: sqlite3.Connection, where: list[str], params: list[object], limit: int | None
) -> int:
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    inner = f"SELECT 1 FROM runs {clause}" + (" LIMIT ?" if limit is not None else "")
    args = (*params, limit) if limit is not None else tuple(params)
    return int(conn.execute(f"SELECT count(*) FROM ({inner})", args).fetchone()[0])


def _list_events(
    conn: sqlite3.Connection,
    run_id: str,
    after_slot: int,
    limit: int,
    correlation_id: str | None = None,
) -> records.EventPage:
    """A page of the run's log; with ``correlation_id``, of that entity's events only
    (``events_by_entity`` finds them without reading the rest of the log)."""
    counters = conn.execute(
        "SELECT seq, seq_in_band FROM runs WHERE run_id = ?", (run_id,)
    ).fetchone()
    if counters is None:
        raise errors.RunNotFound(run_id)
    if correlation_id is None:
        rows = conn.execute(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id = ? AND slot > ? "
            "ORDER BY slot LIMIT ?",
            (run_id, after_slot, limit + 1),
        ).fetchall()
    else:
        rows = conn.execute(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id = ? AND correlation_id = ? "
            "AND slot > ? ORDER BY slot LIMIT ?",
            (run_id, correlation_id, after_slot, limit + 1),
        ).fetchall()
    page = tuple(row_to_event(r) for r in rows[:limit])
    return records.EventPage(
        events=page,
        snapshot=events.Snapshot(seq=counters[0], seq_in_band=counters[1]),
        has_more=len(rows) > limit,
        cursor=page[-1].slot if page else after_slot,
    )


class LocalRuns:
    def __init__(self, db: Database, feed: Feed) -> None:
        self._db = db
        self._feed = feed

    async def create(
        self,
        *,
        workflow_name: str,
        input: JsonValue,
        deployment_id: str,
        spec_version: int,
        run_id: str | None = None,
        attributes: Mapping[str, JsonValue] | None = None,
        parent_run_id: str | None = None,
        parent_correlation_id: str | None = None,
    ) -> records.RunRecord:
        storagerules.check_run_id(run_id)
        rid = run_id or ids.new_run_id()
        created, first = await self._db.call(
            functools.partial(
                eventlog.create_run,
                run_id=rid,
                workflow_name=workflow_name,
                input=input,
                deployment_id=deployment_id,
                spec_version=spec_version,
                attributes=dict(attributes or {}),
                parent=(parent_run_id, parent_correlation_id),
            )
        )
        if created:
            self._feed.publish(rid, [first])
        return await self.get(rid)

    async def get(self, run_id: str) -> records.RunRecord:
        return await self._db.call(functools.partial(_get_run, run_id=run_id))

    async def repin(
        self,
        run_id: str,
        *,
        from_deployment: str,
        to_deployment: str,
        reason: str | None = None,
    ) -> records.RunRecord:
        logged = await self._db.call(
            functools.partial(
                eventlog.repin, run_id=run_id, from_deployment=from_deployment,
                to_deployment=to_deployment, reason=reason,
            )
        )  # fmt: skip
        self._feed.publish(run_id, [logged])
        return await self.get(run_id)

    async def list(
        self,
        *,
        status: records.RunStatus | None = None,
        workflow_name: str | None = None,
        deployment_id: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        attributes: Mapping[str, JsonValue] | None = None,
    ) -> records.RunPage:
        if limit < 1:
            raise errors.WorldContractError(f"runs.list needs limit >= 1, got {limit}")
        wanted = run_attributes.check_filter(attributes)
        where: list[str] = []
        params: list[object] = []
        for column, value in (
            ("status", status),
            ("workflow_name", workflow_name),
            ("deployment_id", deployment_id),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        for key, wanted_value in (wanted or {}).items():
            # run_attributes_by_value (key, value, run_id): one index range per filter.
            where.append(
                "run_id IN (SELECT run_id FROM run_attributes WHERE key = ? AND value = ?)"
            )
            params += [key, run_attributes.canonical(wanted_value)]
        if cursor is not None:
            created_s, _, last_id = cursor.partition(":")
            if not created_s.isdigit() or not last_id:
                raise errors.WorldContractError(f"runs.list cursor {cursor!r} is not valid")
            where.append("(created_at < ? OR (created_at = ? AND run_id < ?))")
            params += [int(created_s), int(created_s), last_id]
        rows = await self._db.call(
            functools.partial(_list_runs, where=where, params=params, limit=limit)
        )
        runs = tuple(_run_record(r) for r in rows[:limit])
        next_cursor = None
        if len(rows) > limit:
            last = rows[limit - 1]
            next_cursor = f"{last[6]}:{last[0]}"
        return records.RunPage(runs=runs, next_cursor=next_cursor)

    async def count(
        self,
        *,
        statuses: Sequence[records.RunStatus] | None = None,
        deployment_id: str | None = None,
        limit: int | None = None,
    ) -> int:
        wanted = storagerules.check_count(statuses, limit)
        where: list[str] = []
        params: list[object] = []
        if wanted is not None:
            where.append(f"status IN ({', '.join('?' for _ in wanted)})")
            params += wanted
        if deployment_id is not None:
            where.append("deployment_id = ?")
            params.append(deployment_id)
        return await self._db.call(
            functools.partial(_count_runs, where=where, params=params, limit=limit)
        )


class LocalEvents:
    def __init__(self, db: Database, feed: Feed) -> None:
        self._db = db
        self._feed = feed

    async def create(
        self,
        run_id: str,
        event: events.Event,
        *,
        in_band: bool,
        expected_seq_in_band: int | None = None,
        event_count: int | None = None,
        occurred_at: datetime | None = None,
        idempotency_key: str | None = None,
    ) -> records.EventResult:
        params = eventlog.WriteParams(in_band, expected_seq_in_band, event_count, occurred_at)
        appended = await self._db.call(
            functools.partial(
                eventlog.append, run_id=run_id, event=event, params=params,
                idempotency_key=idempotency_key,
            )
        )  # fmt: skip
        if appended.allocated:
            self._feed.publish(run_id, appended.committed)
        for foreign in appended.foreign:  # a force-claim's write into the holder's log
            self._feed.publish(foreign.run_id, [foreign])
        return records.EventResult(
            event=appended.committed[0],
            allocated=appended.allocated,
            report=tuple(appended.report),
            has_more=appended.has_more,
        )

    async def create_batch(
        self,
        run_id: str,
        batch: Sequence[events.Event],
        *,
        in_band: bool,
        expected_seq_in_band: int | None = None,
        event_count: int | None = None,
        occurred_at: datetime | None = None,
    ) -> records.BatchResult:
        params = eventlog.WriteParams(in_band, expected_seq_in_band, event_count, occurred_at)
        appended = await self._db.call(
            functools.partial(
                eventlog.append_batch, run_id=run_id, batch=list(batch), params=params
            )
        )
        if appended.committed:
            self._feed.publish(run_id, appended.committed)
        items = tuple(
            records.BatchItemResult(error=item)
            if isinstance(item, errors.WorldError)
            else records.BatchItemResult(event=item)
            for item in appended.items
        )
        return records.BatchResult(
            items=items,
            allocated=appended.allocated,
            report=tuple(appended.report),
            has_more=appended.has_more,
        )

    async def list(
        self, run_id: str, *, after_slot: int = 0, limit: int = 1000
    ) -> records.EventPage:
        if limit < 1 or after_slot < 0:
            raise errors.WorldContractError(
                f"events.list needs limit >= 1 and after_slot >= 0 "
                f"(got limit {limit}, after_slot {after_slot})",
                run_id=run_id,
            )
        return await self._db.call(
            functools.partial(_list_events, run_id=run_id, after_slot=after_slot, limit=limit)
        )

    async def list_entity(
        self, run_id: str, correlation_id: str, *, after_slot: int = 0, limit: int = 1000
    ) -> records.EventPage:
        storagerules.check_list_args(run_id, after_slot, limit, "events.list_entity")
        return await self._db.call(
            functools.partial(
                _list_events,
                run_id=run_id,
                after_slot=after_slot,
                limit=limit,
                correlation_id=correlation_id,
            )
        )

    def subscribe(
        self,
        run_id: str,
        after_slot: int,
        on_event: contract.EventCallback,
        on_error: contract.ErrorCallback,
    ) -> Subscription:
        return self._feed.subscribe(run_id, after_slot, on_event, on_error)


class LocalSteps:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def list(self, run_id: str) -> list[records.StepRecord]:
        def query(conn: sqlite3.Connection) -> list[tuple[object, ...]]:
            if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
                raise errors.RunNotFound(run_id)
            return conn.execute(
                f"SELECT {_STEP_COLUMNS} FROM steps WHERE run_id = ? ORDER BY created_at, step_id",
                (run_id,),
            ).fetchall()

        return [_step_record(r) for r in await self._db.call(query)]

    async def get(self, run_id: str, step_id: str) -> records.StepRecord:
        def query(conn: sqlite3.Connection) -> tuple[object, ...] | None:
            row: tuple[object, ...] | None = conn.execute(
                f"SELECT {_STEP_COLUMNS} FROM steps WHERE run_id = ? AND step_id = ?",
                (run_id, step_id),
            ).fetchone()
            return row

        row = await self._db.call(query)
        if row is None:
            raise errors.StepNotFound(run_id, step_id=step_id)
        return _step_record(row)


class LocalHooks:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def get_by_token(self, token: str) -> records.HookRecord:
        def query(conn: sqlite3.Connection) -> tuple[object, ...] | None:
            row: tuple[object, ...] | None = conn.execute(
                "SELECT h.token, h.run_id, h.hook_id, h.created_at, h.metadata, t.retain_until, "
                "r.status FROM hooks h JOIN runs r ON r.run_id = h.run_id "
                "LEFT JOIN hook_retention t ON t.token = h.token WHERE h.token = ?",
                (token,),
            ).fetchone()
            return row

        row = await self._db.call(query)
        until = None if row is None or row[5] is None else from_us(cast(int, row[5]))
        if row is None or storagerules.holder_expired(
            run_ended=row[6] in ("completed", "failed", "cancelled"),
            retained_until=until,
            now=from_us(now_us()),
        ):
            raise errors.HookNotFound(token)
        return records.HookRecord(
            token=str(row[0]),
            run_id=str(row[1]),
            hook_id=str(row[2]),
            created_at=from_us(cast(int, row[3])),
            metadata=_opt_json(cast(str | None, row[4])),
            retained_until=until,
        )


_DEPLOYMENT_COLUMNS = "deployment_id, created_at, retired, catalogue, promoted IS NOT NULL"


def _deployment(row: tuple[object, ...]) -> records.DeploymentRecord:
    return records.DeploymentRecord(
        deployment_id=str(row[0]),
        created_at=from_us(cast(int, row[1])),
        retired=bool(row[2]),
        catalogue=_opt_json(cast(str | None, row[3])),
        promoted=bool(row[4]),
    )


class LocalDeployments:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def register(
        self, deployment_id: str, *, catalogue: JsonValue = None
    ) -> records.DeploymentRecord:
        if not deployment_id:
            raise errors.WorldContractError("a deployment id must not be empty")
        text = None if catalogue is None else json.dumps(catalogue)

        def upsert(conn: sqlite3.Connection) -> tuple[object, ...]:
            with transaction(conn):
                conn.execute(
                    "INSERT OR IGNORE INTO deployments (deployment_id, created_at, registered) "
                    "VALUES (?, ?, (SELECT COALESCE(MAX(registered), 0) + 1 FROM deployments))",
                    (deployment_id, now_us()),
                )
                if text is not None:
                    conn.execute(
                        "UPDATE deployments SET catalogue = ? WHERE deployment_id = ?",
                        (text, deployment_id),
                    )
                row: tuple[object, ...] = conn.execute(
                    f"SELECT {_DEPLOYMENT_COLUMNS} FROM deployments WHERE deployment_id = ?",
                    (deployment_id,),
                ).fetchone()
                return row

        return _deployment(await self._db.call(upsert))

    async def get(self, deployment_id: str) -> records.DeploymentRecord | None:
        def query(conn: sqlite3.Connection) -> tuple[object, ...] | None:
            row: tuple[object, ...] | None = conn.execute(
                f"SELECT {_DEPLOYMENT_COLUMNS} FROM deployments WHERE deployment_id = ?",
                (deployment_id,),
            ).fetchone()
            return row

        row = await self._db.call(query)
        return None if row is None else _deployment(row)

    async def latest(self) -> str | None:
        def query(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT deployment_id FROM deployments WHERE retired = 0 "
                "ORDER BY promoted IS NULL, promoted DESC, registered DESC LIMIT 1"
            ).fetchone()
            return None if row is None else str(row[0])

        return await self._db.call(query)

    async def list(self, *, limit: int = 1000) -> list[records.DeploymentRecord]:
        def query(conn: sqlite3.Connection) -> list[tuple[object, ...]]:
            rows: list[tuple[object, ...]] = conn.execute(
                f"SELECT {_DEPLOYMENT_COLUMNS} FROM deployments ORDER BY registered DESC LIMIT ?",
                (limit,),
            ).fetchall()
            return rows

        return [_deployment(row) for row in await self._db.call(query)]

    async def retire(self, deployment_id: str) -> None:
        def update(conn: sqlite3.Connection) -> None:
            with transaction(conn):
                conn.execute(
                    "UPDATE deployments SET retired = 1 WHERE deployment_id = ?", (deployment_id,)
                )

        await self._db.call(update)

    async def promote(self, deployment_id: str) -> None:
        if not deployment_id:
            raise errors.WorldContractError("a deployment id must not be empty")

        def update(conn: sqlite3.Connection) -> None:
            with transaction(conn):
                row = conn.execute(
                    "SELECT retired, promoted, (SELECT MAX(promoted) FROM deployments) "
                    "FROM deployments WHERE deployment_id = ?",
                    (deployment_id,),
                ).fetchone()
                if row is None:
                    conn.execute(
                        "INSERT INTO deployments (deployment_id, created_at, registered) "
                        "VALUES (?, ?, (SELECT COALESCE(MAX(registered), 0) + 1 FROM deployments))",
                        (deployment_id, now_us()),
                    )
                elif row[0]:
                    raise errors.DeploymentRetired(deployment_id)
                elif row[1] is not None and row[1] == row[2]:
                    return  # already the newest promoted
                conn.execute(
                    "UPDATE deployments SET promoted = "
                    "(SELECT COALESCE(MAX(promoted), 0) + 1 FROM deployments) "
                    "WHERE deployment_id = ?",
                    (deployment_id,),
                )

        await self._db.call(update)
