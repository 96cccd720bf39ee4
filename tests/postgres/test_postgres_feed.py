"""The Postgres live feed: LISTEN/NOTIFY across processes, a lost listener, subscriber bugs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from treadle import errors
from treadle.world import events
from treadle.worlds.postgres import PostgresStorage, feed

WAIT = 10.0


@pytest.fixture
async def storage(pg_dsn: str) -> AsyncIterator[PostgresStorage]:
    opened = await PostgresStorage.connect(pg_dsn, pool_size=2)
    try:
        yield opened
    finally:
        await opened.close()


async def _run(storage: PostgresStorage) -> str:
    run = await storage.runs.create(
        workflow_name="wf", input=None, deployment_id="d", spec_version=9
    )
    return run.run_id


async def _listener_pid(storage: PostgresStorage) -> int:
    for _ in range(200):
        pid = storage.feed.listener_pid
        if pid is not None:
            return pid
        await asyncio.sleep(0.05)
    raise AssertionError("the feed never opened its LISTEN connection")


class Collected:
    def __init__(self) -> None:
        self.events: asyncio.Queue[events.LoggedEvent] = asyncio.Queue()
        self.errors: asyncio.Queue[BaseException] = asyncio.Queue()

    def on_event(self, event: events.LoggedEvent) -> None:
        self.events.put_nowait(event)

    def on_error(self, exc: BaseException) -> None:
        self.errors.put_nowait(exc)

    async def slots(self, count: int) -> list[int]:
        return [(await asyncio.wait_for(self.events.get(), WAIT)).slot for _ in range(count)]


async def test_another_processs_writes_are_pushed_by_notify(
    storage: PostgresStorage, pg_dsn: str
) -> None:
    """Events another World instance commits arrive through NOTIFY, in slot order, no poll."""
    run_id = await _run(storage)
    seen = Collected()
    sub = storage.events.subscribe(run_id, 0, seen.on_event, seen.on_error)
    try:
        assert await seen.slots(1) == [1]
        async with await PostgresStorage.connect(pg_dsn, pool_size=4) as other:
            await asyncio.gather(
                *(
                    other.events.create(run_id, events.AttrSet(key=f"k{i}", value=i), in_band=False)
                    for i in range(10)
                )
            )
            await other.events.create_batch(
                run_id,
                [events.StepCreated(correlation_id=f"s{i}", step_name="f") for i in range(3)],
                in_band=False,
            )
        assert await seen.slots(13) == list(range(2, 15))
        assert seen.errors.empty()
    finally:
        sub.close()


async def test_a_dropped_listener_connection_is_reported_through_on_error(
    storage: PostgresStorage, pg_dsn: str
) -> None:
    """pg_terminate_backend on the LISTEN connection: every subscription hears it once."""
    run_id = await _run(storage)
    first, second = Collected(), Collected()
    subs = [
        storage.events.subscribe(run_id, 0, first.on_event, first.on_error),
        storage.events.subscribe(run_id, 1, second.on_event, second.on_error),
    ]
    try:
        assert await first.slots(1) == [1]
        pid = await _listener_pid(storage)
        admin = await asyncpg.connect(pg_dsn)
        try:
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        finally:
            await admin.close()
        for seen in (first, second):
            lost = await asyncio.wait_for(seen.errors.get(), WAIT)
            assert isinstance(lost, errors.StorageUnavailable)
            assert "LISTEN connection" in str(lost)
        await storage.events.create(run_id, events.Noop(), in_band=False)
        await asyncio.sleep(0.3)
        assert second.events.empty()  # a failed subscription is closed
        assert first.errors.empty() and second.errors.empty()
        # A new subscription opens a new listener and is fed again.
        again = Collected()
        subs.append(storage.events.subscribe(run_id, 1, again.on_event, again.on_error))
        assert await again.slots(1) == [2]
        await storage.events.create(run_id, events.Noop(), in_band=False)
        assert await again.slots(1) == [3]
        assert await _listener_pid(storage) != pid
    finally:
        for sub in subs:
            sub.close()


async def test_a_failing_subscriber_hears_its_error_and_keeps_receiving(
    storage: PostgresStorage,
) -> None:
    run_id = await _run(storage)
    seen = Collected()

    def on_event(event: events.LoggedEvent) -> None:
        seen.on_event(event)
        if event.slot == 2:
            raise RuntimeError("subscriber bug")

    sub = storage.events.subscribe(run_id, 0, on_event, seen.on_error)
    try:
        for _ in range(3):
            await storage.events.create(run_id, events.Noop(), in_band=False)
        assert await seen.slots(4) == [1, 2, 3, 4]
        failure = await asyncio.wait_for(seen.errors.get(), WAIT)
        assert str(failure) == "subscriber bug"
    finally:
        sub.close()


async def test_subscribe_to_an_unknown_run_reports_run_not_found(
    storage: PostgresStorage,
) -> None:
    seen = Collected()
    sub = storage.events.subscribe(
        "wrun_00000000000000000000000000", 0, seen.on_event, seen.on_error
    )
    try:
        assert isinstance(await asyncio.wait_for(seen.errors.get(), WAIT), errors.RunNotFound)
    finally:
        sub.close()


async def test_close_ends_the_feed_quietly(pg_dsn: str) -> None:
    storage = await PostgresStorage.connect(pg_dsn)
    run_id = await _run(storage)
    seen = Collected()
    storage.events.subscribe(run_id, 0, seen.on_event, seen.on_error)
    assert await seen.slots(1) == [1]
    await storage.close()
    await asyncio.sleep(0.2)
    assert seen.errors.empty()
    with pytest.raises(errors.StorageUnavailable):
        await storage.runs.get(run_id)


async def test_a_listener_that_stops_answering_is_reported(
    storage: PostgresStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heartbeat finds a LISTEN connection whose socket died silently."""
    monkeypatch.setattr(feed, "HEARTBEAT_SECONDS", 0.05)
    run_id = await _run(storage)
    seen = Collected()
    sub = storage.events.subscribe(run_id, 0, seen.on_event, seen.on_error)
    try:
        assert await seen.slots(1) == [1]
        listener = storage.feed._conn
        original = asyncpg.connection.Connection.execute

        async def execute(self: asyncpg.Connection, query: str, *args: object, **kw: object) -> str:
            if self is listener:
                raise ConnectionResetError("the network dropped")
            return await original(self, query, *args, **kw)

        monkeypatch.setattr(asyncpg.connection.Connection, "execute", execute)
        lost = await asyncio.wait_for(seen.errors.get(), WAIT)
        assert isinstance(lost, errors.StorageUnavailable)
        assert "the network dropped" in str(lost)
        assert storage.feed.listener_pid is None
    finally:
        sub.close()
