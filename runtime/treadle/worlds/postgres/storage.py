"""The Postgres World's storage half: runs, events, steps and hooks on asyncpg.

``await PostgresStorage.connect(dsn)`` opens a pool on a database that
``treadle migrate`` brought to this treadle's schema (``IncompatibleStorage``
otherwise) and offers ``runs``, ``events``, ``steps`` and ``hooks`` as the World
contract has them (``treadle.world.contract``). Every call is one statement:
writes call the append functions of ``migrations/0001_init.sql`` (see
``append``), reads are single queries, so a page's snapshot and its events come
from one consistent state. With ``group_writes``, out-of-band writes of one run
that queue behind one in flight share a statement (``combiner``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import JsonValue

from treadle import errors
from treadle.world import attributes as run_attributes
from treadle.world import contract, events, ids, records, storagerules
from treadle.worlds.postgres import append, combiner, migrate, rows
from treadle.worlds.postgres.database import (
    DEFAULT_POOL_SIZE,
    STATEMENT_CACHE_SIZE,
    STATEMENT_TIMEOUT_MS,
    Database,
)
from treadle.worlds.postgres.feed import Feed, Subscription
from treadle.worlds.postgres.heartbeats import PostgresHeartbeats
from treadle.worlds.postgres.limits import PostgresLimits
from treadle.worlds.postgres.schedules import PostgresSchedules
from treadle.worlds.postgres.streams import PostgresStreams

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_CREATE_RUN_SQL = "SELECT * FROM treadle_create_run($1, $2::jsonb)"
_REPIN_SQL = "SELECT * FROM treadle_repin($1, $2::jsonb)"  # migration 0009
_GET_RUN_SQL = f"SELECT {rows.RUN_COLUMNS} FROM treadle_runs WHERE run_id = $1"
# The counters and the page in one statement: one snapshot for both.
_LIST_EVENTS_SQL = f"""
SELECT r.seq, r.seq_in_band, e.slot, e.created_at, e.in_band, e.data
FROM treadle_runs r
LEFT JOIN LATERAL (
    SELECT {rows.EVENT_COLUMNS} FROM treadle_events
    WHERE run_id = r.run_id AND slot > $2 ORDER BY slot LIMIT $3
) e ON true
WHERE r.run_id = $1
ORDER BY e.slot
"""
# One entity's events (a step's, for its message's delivery): ``treadle_events_creations``
# (run_id, correlation_id, slot) finds them without reading the rest of the log.
_LIST_ENTITY_EVENTS_SQL = f"""
SELECT r.seq, r.seq_in_band, e.slot, e.created_at, e.in_band, e.data
FROM treadle_runs r
LEFT JOIN LATERAL (
    SELECT {rows.EVENT_COLUMNS} FROM treadle_events
    WHERE run_id = r.run_id AND correlation_id = $4 AND slot > $2 ORDER BY slot LIMIT $3
) e ON true
WHERE r.run_id = $1
ORDER BY e.slot
"""
_LIST_STEPS_SQL = f"""
SELECT r.run_id, {", ".join(f"s.{c.strip()}" for c in rows.STEP_COLUMNS.split(",")[1:])}
FROM treadle_runs r LEFT JOIN treadle_steps s ON s.run_id = r.run_id
WHERE r.run_id = $1
ORDER BY s.created_at, s.step_id
"""
_GET_STEP_SQL = f"SELECT {rows.STEP_COLUMNS} FROM treadle_steps WHERE run_id = $1 AND step_id = $2"
_GET_HOOK_SQL = (
    "SELECT h.token, h.run_id, h.hook_id, h.created_at, h.metadata, h.retained_until, "
    "r.status::text, now() FROM treadle_hooks h JOIN treadle_runs r ON r.run_id = h.run_id "
    "WHERE h.token = $1"
)


class PostgresRuns:
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
        created = events.RunCreated(
            workflow_name=workflow_name,
            input=input,
            deployment_id=deployment_id,
            spec_version=spec_version,
            attributes=dict(attributes or {}),
            parent_run_id=parent_run_id,
            parent_correlation_id=parent_correlation_id,
        )
        row = await self._db.fetchrow(_CREATE_RUN_SQL, rid, created.model_dump_json())
        if row is None:
            raise errors.StorageUnavailable(f"run {rid}: treadle_create_run returned nothing")
        run = rows.run_record(row, offset=2)
        if row[0] and parent_run_id is not None:
            # Stored by migration 0012's trigger; treadle_create_run's answer omits it.
            run = dataclasses.replace(
                run, parent_run_id=parent_run_id, parent_correlation_id=parent_correlation_id
            )
        elif not row[0]:
            held_first = events.parse_event(row[1])
            if isinstance(held_first, events.RunCreated) and held_first.parent_run_id:
                run = dataclasses.replace(
                    run,
                    parent_run_id=held_first.parent_run_id,
                    parent_correlation_id=held_first.parent_correlation_id,
                )
        if row[0]:
            first = events.LoggedEvent(
                run_id=rid, slot=1, created_at=run.created_at, in_band=True, event=created
            )
            self._feed.publish(rid, [first])
            return run
        held = events.parse_event(row[1])
        assert isinstance(held, events.RunCreated)
        storagerules.check_same_run(
            rid, held, workflow_name=workflow_name, input=input, deployment_id=deployment_id
        )
        return run

    async def get(self, run_id: str) -> records.RunRecord:
        row = await self._db.fetchrow(_GET_RUN_SQL, run_id)
        if row is None:
            raise errors.RunNotFound(run_id)
        return rows.run_record(row)

    async def repin(
        self,
        run_id: str,
        *,
        from_deployment: str,
        to_deployment: str,
        reason: str | None = None,
    ) -> records.RunRecord:
        storagerules.check_repin_args(run_id, from_deployment, to_deployment)
        event = events.RunRepinned(
            from_deployment=from_deployment, to_deployment=to_deployment, reason=reason
        )
        with self._feed.writing(run_id):
            row = await self._db.fetchrow(_REPIN_SQL, run_id, event.model_dump_json())
            if row is None:
                raise errors.StorageUnavailable(f"run {run_id}: treadle_repin returned nothing")
            if not row["o_moved"]:
                storagerules.check_repin(
                    run_id, status=str(row["o_status"]), current=str(row["o_current"]),
                    from_deployment=from_deployment, to_deployment=to_deployment,
                    target_retired=row["o_target_retired"],
                )  # fmt: skip
                raise errors.StorageUnavailable(
                    f"run {run_id}: treadle_repin refused a move storagerules allows"
                )
            logged = events.LoggedEvent(
                run_id=run_id, slot=row["o_slot"], created_at=row["o_created_at"],
                in_band=False, event=event,
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
                params.append(value)
                where.append(f"{column} = ${len(params)}")
        if wanted:
            # Containment of scalars is equality; served by treadle_runs_by_attributes
            # (migration 0012, GIN jsonb_path_ops).
            params.append(json.dumps(wanted))
            where.append(f"attributes @> ${len(params)}::jsonb")
        if cursor is not None:
            created_s, _, last_id = cursor.partition(":")
            if not created_s.isdigit() or not last_id:
                raise errors.WorldContractError(f"runs.list cursor {cursor!r} is not valid")
            params += [_EPOCH + timedelta(microseconds=int(created_s)), last_id]
            where.append(f"(created_at, run_id) < (${len(params) - 1}, ${len(params)})")
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        params.append(limit + 1)
        found = await self._db.fetch(
            f"SELECT {rows.RUN_COLUMNS} FROM treadle_runs {clause} "
            f"ORDER BY created_at DESC, run_id DESC LIMIT ${len(params)}",
            *params,
        )
        runs = tuple(rows.run_record(r) for r in found[:limit])
        next_cursor = None
        if len(found) > limit:
            last = runs[limit - 1]
            next_cursor = f"{rows.to_us(last.created_at)}:{last.run_id}"
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
            params.append(list(wanted))
            where.append(f"status = ANY(${len(params)}::treadle_run_status[])")
        if deployment_id is not None:
            params.append(deployment_id)
            where.append(f"deployment_id = ${len(params)}")
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        if limit is None:
            sql = f"SELECT count(*) FROM treadle_runs {clause}"
        else:  # stops at the limit: LIMIT 1 is an existence test
            params.append(limit)
            limited = f"SELECT 1 FROM treadle_runs {clause} LIMIT ${len(params)}"
            sql = f"SELECT count(*) FROM ({limited}) t"
        row = await self._db.fetchrow(sql, *params)
        return int(row[0]) if row is not None else 0


class PostgresEvents:
    def __init__(self, db: Database, feed: Feed, *, group_writes: bool = True) -> None:
        self._db = db
        self._feed = feed
        # Out-of-band writes of one run that queue behind another go as one (combiner).
        self.combiner = combiner.Combiner(db, feed, self._create_alone)
        self._group_writes = group_writes

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
        if event.type == "run_repinned":  # run_created: refused by treadle_append
            storagerules.check_event_write(run_id, event)
        if self._group_writes and combiner.groupable(
            event, in_band=in_band, idempotency_key=idempotency_key
        ):
            return await self.combiner.create(run_id, event)
        params = append.WriteParams(in_band, expected_seq_in_band, event_count, occurred_at)
        return await self._write(run_id, event, params, idempotency_key)

    async def _create_alone(self, run_id: str, event: events.Event) -> records.EventResult:
        # The combiner's lone write: others queue behind it, so it does not wait its turn.
        params = append.WriteParams(in_band=False)
        return await self._write(run_id, event, params, None, first=True)

    async def _write(
        self,
        run_id: str,
        event: events.Event,
        params: append.WriteParams,
        idempotency_key: str | None,
        *,
        first: bool = False,
    ) -> records.EventResult:
        with self._feed.writing(run_id):
            result = await append.create(
                self._db, run_id, event, params, idempotency_key, first=first
            )
            if result.allocated:
                self._feed.publish(run_id, [result.event])
        return result

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
        params = append.WriteParams(in_band, expected_seq_in_band, event_count, occurred_at)
        with self._feed.writing(run_id):
            result, committed = await append.create_batch(self._db, run_id, batch, params)
            if committed:
                self._feed.publish(run_id, committed)
        return result

    async def list(
        self, run_id: str, *, after_slot: int = 0, limit: int = 1000
    ) -> records.EventPage:
        if limit < 1 or after_slot < 0:
            raise errors.WorldContractError(
                f"events.list needs limit >= 1 and after_slot >= 0 "
                f"(got limit {limit}, after_slot {after_slot})",
                run_id=run_id,
            )
        found = await self._db.fetch(_LIST_EVENTS_SQL, run_id, after_slot, limit + 1)
        if not found:
            raise errors.RunNotFound(run_id)
        snapshot = events.Snapshot(seq=found[0][0], seq_in_band=found[0][1])
        page = tuple(rows.event(run_id, r, 2) for r in found[:limit] if r[2] is not None)
        return records.EventPage(
            events=page,
            snapshot=snapshot,
            has_more=len(found) > limit,
            cursor=page[-1].slot if page else after_slot,
        )

    async def list_entity(
        self, run_id: str, correlation_id: str, *, after_slot: int = 0, limit: int = 1000
    ) -> records.EventPage:
        storagerules.check_list_args(run_id, after_slot, limit, "events.list_entity")
        found = await self._db.fetch(
            _LIST_ENTITY_EVENTS_SQL, run_id, after_slot, limit + 1, correlation_id
        )
        if not found:
            raise errors.RunNotFound(run_id)
        snapshot = events.Snapshot(seq=found[0][0], seq_in_band=found[0][1])
        page = tuple(rows.event(run_id, r, 2) for r in found[:limit] if r[2] is not None)
        return records.EventPage(
            events=page,
            snapshot=snapshot,
            has_more=len(found) > limit,
            cursor=page[-1].slot if page else after_slot,
        )

    def subscribe(
        self,
        run_id: str,
        after_slot: int,
        on_event: contract.EventCallback,
        on_error: contract.ErrorCallback,
    ) -> Subscription:
        return self._feed.subscribe(run_id, after_slot, on_event, on_error)


class PostgresSteps:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def list(self, run_id: str) -> list[records.StepRecord]:
        found = await self._db.fetch(_LIST_STEPS_SQL, run_id)
        if not found:
            raise errors.RunNotFound(run_id)
        return [rows.step_record(r) for r in found if r[1] is not None]

    async def get(self, run_id: str, step_id: str) -> records.StepRecord:
        row = await self._db.fetchrow(_GET_STEP_SQL, run_id, step_id)
        if row is None:
            raise errors.StepNotFound(run_id, step_id=step_id)
        return rows.step_record(row)


class PostgresHooks:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def get_by_token(self, token: str) -> records.HookRecord:
        row = await self._db.fetchrow(_GET_HOOK_SQL, token)
        if row is None or storagerules.holder_expired(
            run_ended=row[6] in ("completed", "failed", "cancelled"),
            retained_until=row[5],
            now=row[7],
        ):
            raise errors.HookNotFound(token)
        return rows.hook_record(row)


class PostgresDeployments:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def register(
        self, deployment_id: str, *, catalogue: JsonValue = None
    ) -> records.DeploymentRecord:
        if not deployment_id:
            raise errors.WorldContractError("a deployment id must not be empty")
        row = await self._db.fetchrow(
            "INSERT INTO treadle_deployments AS d (deployment_id, catalogue) "
            "VALUES ($1, $2::jsonb) ON CONFLICT (deployment_id) DO UPDATE "
            "SET catalogue = COALESCE(EXCLUDED.catalogue, d.catalogue) "
            f"RETURNING {_DEPLOYMENT_COLUMNS}",
            deployment_id,
            None if catalogue is None else json.dumps(catalogue),
        )
        assert row is not None
        return _deployment(row)

    async def get(self, deployment_id: str) -> records.DeploymentRecord | None:
        row = await self._db.fetchrow(
            f"SELECT {_DEPLOYMENT_COLUMNS} FROM treadle_deployments WHERE deployment_id = $1",
            deployment_id,
        )
        return None if row is None else _deployment(row)

    async def latest(self) -> str | None:
        row = await self._db.fetchrow(
            "SELECT deployment_id FROM treadle_deployments WHERE NOT retired "
            "ORDER BY promoted DESC NULLS LAST, registered DESC LIMIT 1"
        )
        return None if row is None else str(row["deployment_id"])

    async def list(self, *, limit: int = 1000) -> list[records.DeploymentRecord]:
        found = await self._db.fetch(
            f"SELECT {_DEPLOYMENT_COLUMNS} FROM treadle_deployments "
            "ORDER BY registered DESC LIMIT $1",
            limit,
        )
        return [_deployment(row) for row in found]

    async def retire(self, deployment_id: str) -> None:
        await self._db.fetch(
            "UPDATE treadle_deployments SET retired = true WHERE deployment_id = $1",
            deployment_id,
        )

    async def promote(self, deployment_id: str) -> None:
        if not deployment_id:
            raise errors.WorldContractError("a deployment id must not be empty")
        # One statement: insert if unknown; bump unless already the newest promoted.
        row = await self._db.fetchrow(
            "INSERT INTO treadle_deployments AS d (deployment_id, promoted) "
            "VALUES ($1, nextval('treadle_deployment_promotions')) "
            "ON CONFLICT (deployment_id) DO UPDATE SET promoted = CASE "
            "WHEN d.promoted IS NOT NULL AND d.promoted = "
            "(SELECT MAX(promoted) FROM treadle_deployments) THEN d.promoted "
            "ELSE EXCLUDED.promoted END WHERE NOT d.retired "
            "RETURNING d.deployment_id",
            deployment_id,
        )
        if row is None:
            raise errors.DeploymentRetired(deployment_id)


_DEPLOYMENT_COLUMNS = (
    "deployment_id, created_at, retired, catalogue::text AS catalogue, "
    "promoted IS NOT NULL AS promoted"
)


def _deployment(row: Any) -> records.DeploymentRecord:
    catalogue = row["catalogue"]
    return records.DeploymentRecord(
        deployment_id=str(row["deployment_id"]),
        created_at=row["created_at"],
        retired=bool(row["retired"]),
        catalogue=None if catalogue is None else json.loads(catalogue),
        promoted=bool(row["promoted"]),
    )


class PostgresStorage:
    """The storage half of the Postgres World: ``runs``, ``events``, ``steps``, ``hooks``."""

    def __init__(self, db: Database, *, group_writes: bool = True) -> None:
        self._db = db
        self.feed = Feed(db.dsn, self._list_page)
        self.changes: contract.Changes = self.feed
        self.runs: contract.Runs = PostgresRuns(db, self.feed)
        self.events: contract.Events = PostgresEvents(db, self.feed, group_writes=group_writes)
        self.steps: contract.Steps = PostgresSteps(db)
        self.hooks: contract.Hooks = PostgresHooks(db)
        self.deployments: contract.Deployments = PostgresDeployments(db)
        self.schedules: contract.Schedules = PostgresSchedules(db)  # issue 17 item 3
        self.limits: contract.LimitStore = PostgresLimits(db)  # issue 17 item 4
        self.heartbeats: contract.Heartbeats = PostgresHeartbeats(db)  # step heartbeats
        self.streams = PostgresStreams(db)  # issue 17 item 6
        self._closed = False

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        pool_size: int = DEFAULT_POOL_SIZE,
        check_schema: bool = True,
        statement_timeout_ms: int = STATEMENT_TIMEOUT_MS,
        statement_cache_size: int = STATEMENT_CACHE_SIZE,
        group_writes: bool = True,
    ) -> PostgresStorage:
        """Open a pool on ``dsn``; with ``check_schema``, refuse a database not at this
        treadle's schema version (``IncompatibleStorage``: run ``treadle migrate``).
        Every statement runs under ``statement_timeout_ms``; each connection keeps up to
        ``statement_cache_size`` prepared statements, 0 none (``database``). With
        ``group_writes``, out-of-band writes of one run that queue behind one in flight
        share a statement (``combiner``)."""
        db = await Database.connect(
            dsn,
            pool_size=pool_size,
            statement_timeout_ms=statement_timeout_ms,
            statement_cache_size=statement_cache_size,
        )
        if check_schema:
            try:
                await migrate.check_schema(db, where=db.where)
            except BaseException:
                await db.close()
                raise
        return cls(db, group_writes=group_writes)

    @property
    def where(self) -> str:
        return self._db.where

    async def _list_page(self, run_id: str, after_slot: int) -> records.EventPage:
        return await self.events.list(run_id, after_slot=after_slot)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.streams.close()
        await self.feed.close()
        await self._db.close()

    async def __aenter__(self) -> PostgresStorage:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"PostgresStorage({self._db.where}, {state})"
