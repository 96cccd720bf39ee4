"""The Postgres World's schema: migrations, the version check, and tables that match the models."""

from __future__ import annotations

import asyncio
import dataclasses
import typing
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from treadle import errors
from treadle.world import events, records
from treadle.worlds.postgres import PostgresStorage
from treadle.worlds.postgres import migrate as migrate_module
from treadle.worlds.postgres.migrate import check_schema, latest_version, load_migrations, migrate


@pytest.fixture
async def conn(pg_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(pg_dsn)
    try:
        yield connection
    finally:
        await connection.close()


async def _enum(conn: asyncpg.Connection, name: str) -> set[str]:
    return set(await conn.fetchval(f"SELECT enum_range(NULL::{name})::text[]"))


async def _columns(conn: asyncpg.Connection, table: str) -> set[str]:
    rows = await conn.fetch(
        "SELECT column_name FROM information_schema.columns WHERE table_name = $1", table
    )
    return {r[0] for r in rows}


def _union_types() -> set[str]:
    """The ``type`` literal of every model in the event union."""
    union = typing.get_args(events.Event)[0]
    return {typing.get_args(m.model_fields["type"].annotation)[0] for m in typing.get_args(union)}


def test_migrations_are_numbered_from_one() -> None:
    """The shipped migrations are 0001.. without gaps, and 0001 creates the log."""
    migrations = load_migrations()
    assert [m.version for m in migrations] == list(range(1, len(migrations) + 1))
    assert latest_version() == len(migrations)
    assert "CREATE FUNCTION treadle_append" in migrations[0].sql


async def test_event_type_enum_is_exactly_the_event_models(conn: asyncpg.Connection) -> None:
    """The events table's type enum holds exactly EVENT_TYPES, the union's members."""
    assert _union_types() == events.EVENT_TYPES
    assert await _enum(conn, "treadle_event_type") == events.EVENT_TYPES


async def test_status_enums_are_exactly_the_record_statuses(conn: asyncpg.Connection) -> None:
    assert await _enum(conn, "treadle_run_status") == set(typing.get_args(records.RunStatus))
    assert await _enum(conn, "treadle_step_status") == set(typing.get_args(records.StepStatus))


async def test_tables_hold_the_record_fields(conn: asyncpg.Connection) -> None:
    """Each read view's table has a column per field of its record, and no more."""

    def fields(record: type[object]) -> set[str]:
        return {f.name for f in dataclasses.fields(record)}  # type: ignore[arg-type]

    # ``waiting_on_limit`` is filled by the readers that show it, from the limit tables.
    assert await _columns(conn, "treadle_runs") == fields(records.RunRecord) - {"waiting_on_limit"}
    assert await _columns(conn, "treadle_steps") == fields(records.StepRecord) | {"outcome_slot"}
    assert await _columns(conn, "treadle_hooks") == fields(records.HookRecord)
    logged = set(events.LoggedEvent.model_fields) - {"event"}
    assert await _columns(conn, "treadle_events") == logged | {
        "data",
        "type",
        "correlation_id",
        "idempotency_key",
    }


async def test_every_event_type_round_trips_through_jsonb(pg_dsn: str) -> None:
    """One event of every type is stored and read back equal to its model."""
    payload = {"z": 1, "a": [1.5, "é", None, {"y": True, "b": 10**20}], "m": {"k": "v"}}
    at = datetime(2030, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    boom = events.ErrorInfo(message="boom", type="ValueError", code="E1", stack="trace")
    async with await PostgresStorage.connect(pg_dsn) as storage:
        holder = await storage.runs.create(
            workflow_name="wf", input=payload, deployment_id="d", spec_version=9
        )
        run = await storage.runs.create(
            workflow_name="wf", input=payload, deployment_id="d", spec_version=9,
            attributes={"team": {"b": 2, "a": 1}},
        )  # fmt: skip
        sent: list[events.Event] = [
            events.RunStarted(),
            events.StepCreated(
                correlation_id="s1", step_name="f", input=payload, creator_message_id="m1",
                position=3, max_retries=2,
            ),
            events.StepStarted(correlation_id="s1", step_name="f", attempt=1, input=payload),
            events.StepRetrying(
                correlation_id="s1", step_name="f", attempt=1, error=boom, retry_after=at,
                creator_message_id="m2",
            ),
            events.StepCompleted(correlation_id="s1", step_name="f", result=payload),
            events.StepFailed(correlation_id="s2", step_name="f", attempt=3, error=boom),
            events.WaitCreated(correlation_id="w1", resume_at=at, position=4),
            events.WaitCompleted(correlation_id="w1"),
            events.HookCreated(correlation_id="h1", token="tok-1", metadata=payload),
            events.HookReceived(correlation_id="h1", payload=payload),
            events.HookDisposed(correlation_id="h1"),
            events.AttrSet(key="k", value=payload),
            events.ChildCreated(
                correlation_id="c1", workflow_name="child", child_run_id="wrun_c1",
                input=payload, position=5, on_parent_close="abandon",
            ),
            events.ChildCompleted(correlation_id="c1", child_run_id="wrun_c1", output=payload),
            events.ChildFailed(
                correlation_id="c2", child_run_id="wrun_c2", error=boom, cancelled=True
            ),
            events.WakeRequested(waits=["w1"]),
            events.WakeRequested(),
            events.Noop(),
        ]  # fmt: skip
        for event in sent:
            await storage.events.create(run.run_id, event, in_band=False)
        await storage.deployments.register("d2")
        await storage.runs.repin(run.run_id, from_deployment="d", to_deployment="d2", reason="é")
        repinned = events.RunRepinned(from_deployment="d", to_deployment="d2", reason="é")
        await storage.events.create(
            holder.run_id, events.HookCreated(correlation_id="h9", token="held"), in_band=False
        )
        conflict = await storage.events.create(
            run.run_id, events.HookCreated(correlation_id="h2", token="held"), in_band=False
        )
        assert conflict.event.event == events.HookConflict(
            correlation_id="h2", token="held", holder_run_id=holder.run_id
        )
        failed = events.RunFailed(error=boom)
        await storage.events.create(run.run_id, failed, in_band=False)
        page = await storage.events.list(run.run_id)
        created = page.events[0].event
        assert isinstance(created, events.RunCreated)
        assert (created.input, created.attributes) == (payload, {"team": {"a": 1, "b": 2}})
        assert [e.event for e in page.events[1:]] == [*sent, repinned, conflict.event.event, failed]
        stored_types = {e.type for e in page.events} | {"run_completed", "run_cancelled"}
        assert stored_types == events.EVENT_TYPES
        for ending in (events.RunCompleted(output=payload), events.RunCancelled(reason="r")):
            other = await storage.runs.create(
                workflow_name="wf", input=None, deployment_id="d", spec_version=9
            )
            result = await storage.events.create(other.run_id, ending, in_band=False)
            assert (await storage.events.list(other.run_id)).events[-1] == result.event
        ended = await storage.runs.get(run.run_id)
        assert (ended.status, ended.error, ended.input) == ("failed", boom, payload)
        assert ended.attributes == {"team": {"a": 1, "b": 2}, "k": payload}
        step = await storage.steps.get(run.run_id, "s1")
        assert (step.status, step.result, step.error, step.retry_after) == (
            "completed", payload, None, at,
        )  # fmt: skip


async def test_migrate_twice_applies_nothing_the_second_time(empty_dsn: str) -> None:
    assert await migrate(empty_dsn) == list(range(1, latest_version() + 1))
    assert await migrate(empty_dsn) == []
    async with await PostgresStorage.connect(empty_dsn) as storage:
        assert (await storage.runs.list()).runs == ()


async def test_concurrent_migrations_apply_each_version_once(empty_dsn: str) -> None:
    """The advisory lock: two processes migrating at once apply each version once between them."""
    first, second = await asyncio.gather(migrate(empty_dsn), migrate(empty_dsn))
    assert sorted([first, second]) == [[], list(range(1, latest_version() + 1))]


async def test_connect_refuses_a_database_without_the_schema(empty_dsn: str) -> None:
    with pytest.raises(errors.IncompatibleStorage, match="run `treadle migrate`"):
        await PostgresStorage.connect(empty_dsn)


async def test_check_schema_names_migrate_when_the_database_is_behind(
    pg_dsn: str, conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A treadle with a migration the database lacks refuses it until `treadle migrate`."""
    current = latest_version()
    assert await check_schema(conn) == current
    monkeypatch.setattr(migrate_module, "latest_version", lambda: current + 1)
    with pytest.raises(errors.IncompatibleStorage) as behind:
        await check_schema(conn)
    assert f"version {current}, behind this treadle's {current + 1}" in str(behind.value)
    assert "run `treadle migrate`" in str(behind.value)
    with pytest.raises(errors.IncompatibleStorage, match="run `treadle migrate`"):
        await PostgresStorage.connect(pg_dsn)


async def test_check_schema_refuses_a_database_from_a_newer_treadle(
    pg_dsn: str, conn: asyncpg.Connection
) -> None:
    await conn.execute(
        "INSERT INTO treadle_schema_version (version, name, checksum) VALUES (99, 'future', '')"
    )
    newer = f"newer than this treadle's {latest_version()}"
    with pytest.raises(errors.IncompatibleStorage, match=newer):
        await check_schema(conn)
    with pytest.raises(errors.IncompatibleStorage, match="upgrade treadle"):
        await PostgresStorage.connect(pg_dsn)
    with pytest.raises(errors.IncompatibleStorage, match="newer"):
        await migrate(pg_dsn)


async def test_unreachable_database_is_storage_unavailable(pg_dsn: str) -> None:
    dsn = pg_dsn.rsplit("/", 1)[0] + "/no_such_database"
    with pytest.raises(errors.StorageUnavailable, match="no_such_database"):
        await PostgresStorage.connect(dsn)
    with pytest.raises(errors.StorageUnavailable):
        await migrate(dsn)
