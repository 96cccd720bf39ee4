"""The Postgres World's write combiner and its notifications, on a real PostgreSQL.

Out-of-band writes of one run that queue behind a write in flight go in one
statement (``combiner``, migration 0011), each caller answered exactly as if it
had written alone; an append NOTIFYs once per transaction, naming its last slot.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any

import asyncpg
import pytest

from treadle import errors
from treadle.world import events, records
from treadle.worlds.postgres import PostgresStorage, feed

WAIT = 10.0
STEPS = 30

Answer = records.EventResult | BaseException


@pytest.fixture
async def storage(pg_dsn: str) -> AsyncIterator[PostgresStorage]:
    opened = await PostgresStorage.connect(pg_dsn, pool_size=4, group_writes=True)
    try:
        yield opened
    finally:
        await opened.close()


async def _run_with_steps(storage: PostgresStorage) -> str:
    run = await storage.runs.create(
        workflow_name="wf", input=None, deployment_id="d", spec_version=9
    )
    created = [events.StepCreated(correlation_id=f"s{i}", step_name="f") for i in range(STEPS)]
    await storage.events.create_batch(run.run_id, created, in_band=False)
    return run.run_id


def _writes() -> list[events.Event]:
    """A fan-out's starts and outcomes, with refusals of every kind mixed in."""
    error = events.ErrorInfo(message="boom")
    writes: list[events.Event] = [
        events.StepStarted(correlation_id=f"s{i}", step_name="f", attempt=1) for i in range(STEPS)
    ]
    writes += [
        events.StepCompleted(correlation_id="s0", step_name="f", result=0),
        events.StepCompleted(correlation_id="s0", step_name="f", result="again"),  # ended
        events.StepStarted(correlation_id="s1", step_name="f", attempt=1),  # stale start
        events.HookReceived(correlation_id="no-such-hook", payload=1),  # no hook
        events.StepRetrying(  # a naive time: refused before it is sent
            correlation_id="s2",
            step_name="f",
            attempt=1,
            error=error,
            retry_after=datetime(2030, 1, 1),
        ),
        events.WaitCompleted(correlation_id="w0"),
        events.WaitCompleted(correlation_id="w0"),  # already completed
        events.StepFailed(correlation_id="s3", step_name="f", attempt=1, error=error),
        events.StepStarted(correlation_id="s3", step_name="f", attempt=2),  # after its outcome
        events.WakeRequested(waits=["w1"]),
        events.Noop(),
    ]
    writes += [
        events.StepCompleted(correlation_id=f"s{i}", step_name="f", result=i)
        for i in range(4, STEPS)
    ]
    return writes


def _shape(answer: Answer, run_id: str) -> tuple[Any, ...]:
    """What a caller heard, without the run id: the slot and event, or the error."""
    if isinstance(answer, records.EventResult):
        return (
            "event",
            answer.event.slot,
            answer.event.in_band,
            answer.allocated,
            answer.event.event,
        )
    return ("error", type(answer).__name__, str(answer).replace(run_id, "RUN"))


async def _concurrently(
    storage: PostgresStorage, run_id: str, writes: list[events.Event]
) -> list[Answer]:
    calls = [storage.events.create(run_id, w, in_band=False) for w in writes]
    return list(await asyncio.gather(*calls, return_exceptions=True))


async def _one_at_a_time(
    storage: PostgresStorage, run_id: str, writes: list[events.Event]
) -> list[Answer]:
    answers: list[Answer] = []
    for write in writes:
        try:
            answers.append(await storage.events.create(run_id, write, in_band=False))
        except errors.WorldError as exc:
            answers.append(exc)
    return answers


async def test_concurrent_out_of_band_writes_are_grouped_and_answered_as_if_alone(
    storage: PostgresStorage,
) -> None:
    """Many writes of one run at once: one goes alone, the rest in one statement; every
    caller hears what it hears writing alone, the log is gap-free, each event once."""
    writes = _writes()
    alone_run, grouped_run = await _run_with_steps(storage), await _run_with_steps(storage)
    alone = await _one_at_a_time(storage, alone_run, writes)
    before = storage.events.combiner.groups  # type: ignore[attr-defined]
    grouped = await _concurrently(storage, grouped_run, writes)

    assert [_shape(a, grouped_run) for a in grouped] == [_shape(a, alone_run) for a in alone]
    refused = {type(a).__name__ for a in grouped if isinstance(a, BaseException)}
    assert refused == {
        "StepAlreadyEnded", "StaleStepStart", "HookNotFound", "WorldContractError",
        "WaitAlreadyCompleted",
    }  # fmt: skip
    # The first write went alone; every later one but the naive time queued as one group.
    assert storage.events.combiner.groups == before + 1  # type: ignore[attr-defined]

    page = await storage.events.list(grouped_run, limit=1000)
    slots = [e.slot for e in page.events]
    assert slots == list(range(1, len(slots) + 1))
    committed = [a.event for a in grouped if isinstance(a, records.EventResult)]
    assert page.events[STEPS + 1 :] == tuple(committed)
    assert page.snapshot.seq == slots[-1]
    step = await storage.steps.get(grouped_run, "s0")
    assert step.status == "completed" and step.result == 0


async def test_a_value_postgres_cannot_store_fails_only_its_own_write(
    storage: PostgresStorage,
) -> None:
    """A group whose statement is refused whole (a NUL in one item's JSON) writes each
    item alone: the bad one is refused, its neighbours commit."""
    run_id = await _run_with_steps(storage)
    writes: list[events.Event] = [
        events.StepCompleted(correlation_id=f"s{i}", step_name="f", result=i) for i in range(6)
    ]
    writes[3] = events.StepCompleted(correlation_id="s3", step_name="f", result="nul\u0000")
    answers = await _concurrently(storage, run_id, writes)
    assert isinstance(answers[3], errors.WorldContractError)
    good = [a for i, a in enumerate(answers) if i != 3]
    assert all(isinstance(a, records.EventResult) for a in good), good
    slots = sorted(a.event.slot for a in good if isinstance(a, records.EventResult))
    assert slots == list(range(STEPS + 2, STEPS + 7))
    assert (await storage.steps.get(run_id, "s3")).status != "completed"


async def _backend(admin: asyncpg.Connection, like: str) -> int:
    """The pid of the backend waiting on a lock in a statement matching ``like``."""
    for _ in range(400):
        pid = await admin.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE $1 AND wait_event_type = 'Lock' "
            "AND pid <> pg_backend_pid() LIMIT 1",
            like,
        )
        if pid is not None:
            return int(pid)
        await asyncio.sleep(0.025)
    raise AssertionError(f"no backend waits in {like}")


async def test_a_connection_lost_under_a_group_fails_every_caller_of_it(
    storage: PostgresStorage, pg_dsn: str
) -> None:
    """The run's row is held; the write alone and then the group queue on it; each
    connection is killed in turn: every caller hears StorageUnavailable, nothing is
    written, and the next writes go through."""
    run_id = await _run_with_steps(storage)
    admin = await asyncpg.connect(pg_dsn)
    holder = await asyncpg.connect(pg_dsn)
    try:
        hold = holder.transaction()
        await hold.start()
        await holder.execute("SELECT 1 FROM treadle_runs WHERE run_id = $1 FOR UPDATE", run_id)
        starts = [
            events.StepStarted(correlation_id=f"s{i}", step_name="f", attempt=1) for i in range(5)
        ]
        calls = [
            asyncio.ensure_future(storage.events.create(run_id, s, in_band=False)) for s in starts
        ]
        await admin.fetchval(
            "SELECT pg_terminate_backend($1)", await _backend(admin, "%treadle_append(%")
        )
        with pytest.raises(errors.StorageUnavailable):
            await asyncio.wait_for(calls[0], WAIT)
        group_pid = await _backend(admin, "%treadle_append_group(%")
        await admin.fetchval("SELECT pg_terminate_backend($1)", group_pid)
        answers = await asyncio.wait_for(asyncio.gather(*calls[1:], return_exceptions=True), WAIT)
        assert all(isinstance(a, errors.StorageUnavailable) for a in answers), answers
        await hold.rollback()
    finally:
        await holder.close()
        await admin.close()
    page = await storage.events.list(run_id)
    assert [e.type for e in page.events if e.type == "step_started"] == []
    again = await _concurrently(storage, run_id, starts)
    assert [a.event.slot for a in again if isinstance(a, records.EventResult)] == list(
        range(STEPS + 2, STEPS + 7)
    )


class Notifications:
    """A LISTEN connection of its own on the events channel: what it hears, in order."""

    def __init__(self) -> None:
        self.payloads: list[str] = []
        self.news = asyncio.Event()

    def on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self.payloads.append(payload)
        self.news.set()

    async def until(self, payload: str) -> list[str]:
        """Every notification up to and including ``payload``."""
        async with asyncio.timeout(WAIT):
            while payload not in self.payloads:
                self.news.clear()
                await self.news.wait()
        return self.payloads[: self.payloads.index(payload) + 1]


@pytest.fixture
async def listen(pg_dsn: str) -> AsyncIterator[Notifications]:
    conn = await asyncpg.connect(pg_dsn)
    heard = Notifications()
    await conn.add_listener(feed.CHANNEL, heard.on_notify)
    try:
        yield heard
    finally:
        await conn.close()


async def _heard_for(
    heard: Notifications, storage: PostgresStorage, run_id: str, write: Callable[[], Awaitable[Any]]
) -> list[str]:
    """The notifications ``write`` caused: up to a marker write's own, which follows them."""
    mark = len(heard.payloads)
    await write()
    marker = await storage.events.create(run_id, events.Noop(), in_band=False)
    return (await heard.until(f"{run_id}:{marker.event.slot}"))[mark:-1]


async def test_an_append_notifies_once_naming_its_last_slot(
    storage: PostgresStorage, listen: Notifications
) -> None:
    """A batch of ten and a group of writes: one notification per transaction."""
    run_id = await _run_with_steps(storage)  # slot 1 + 30 steps
    assert (await listen.until(f"{run_id}:{STEPS + 1}"))[-2:] == [
        f"{run_id}:1",
        f"{run_id}:{STEPS + 1}",
    ]
    due = datetime.now().astimezone()
    batch = [events.WaitCreated(correlation_id=f"w{i}", resume_at=due) for i in range(10)]
    heard = await _heard_for(
        listen, storage, run_id,
        lambda: storage.events.create_batch(run_id, batch, in_band=False),
    )  # fmt: skip
    assert heard == [f"{run_id}:{STEPS + 11}"]

    starts = [
        events.StepStarted(correlation_id=f"s{i}", step_name="f", attempt=1) for i in range(20)
    ]
    heard = await _heard_for(
        listen, storage, run_id, lambda: _concurrently(storage, run_id, starts)
    )
    # The first start alone, the other nineteen in one transaction.
    first = STEPS + 13
    assert heard == [f"{run_id}:{first}", f"{run_id}:{first + 19}"]


async def test_the_feed_delivers_every_event_of_a_grouped_append_to_another_world(
    storage: PostgresStorage, pg_dsn: str
) -> None:
    """A subscriber in another World instance hears one notification for a group and
    still receives each of its events, in slot order."""
    run_id = await _run_with_steps(storage)
    async with await PostgresStorage.connect(pg_dsn, pool_size=2, group_writes=True) as other:
        received: asyncio.Queue[events.LoggedEvent] = asyncio.Queue()
        sub = other.events.subscribe(run_id, STEPS + 1, received.put_nowait, print)
        try:
            await other.feed.listening()
            starts = [
                events.StepStarted(correlation_id=f"s{i}", step_name="f", attempt=1)
                for i in range(STEPS)
            ]
            await _concurrently(storage, run_id, starts)
            slots = [(await asyncio.wait_for(received.get(), WAIT)).slot for _ in range(STEPS)]
            assert slots == list(range(STEPS + 2, 2 * STEPS + 2))
        finally:
            sub.close()


async def test_a_write_cancelled_while_it_queues_is_never_sent(
    storage: PostgresStorage, pg_dsn: str
) -> None:
    """The run's row is held so the first write stays in flight; of two writes queued
    behind it, one is cancelled: once the row is free, only the other is written."""
    run_id = await _run_with_steps(storage)
    admin = await asyncpg.connect(pg_dsn)
    holder = await asyncpg.connect(pg_dsn)
    try:
        hold = holder.transaction()
        await hold.start()
        await holder.execute("SELECT 1 FROM treadle_runs WHERE run_id = $1 FOR UPDATE", run_id)
        starts = [
            events.StepStarted(correlation_id=f"s{i}", step_name="f", attempt=1) for i in range(3)
        ]
        calls = [
            asyncio.ensure_future(storage.events.create(run_id, s, in_band=False)) for s in starts
        ]
        await _backend(admin, "%treadle_append(%")  # the first is in flight, the rest queued
        calls[1].cancel()
        await hold.rollback()
        first, third = await asyncio.wait_for(asyncio.gather(calls[0], calls[2]), WAIT)
        assert (first.event.slot, third.event.slot) == (STEPS + 2, STEPS + 3)
        assert calls[1].cancelled()
    finally:
        await holder.close()
        await admin.close()
    page = await storage.events.list(run_id)
    started = [e.event.correlation_id for e in page.events if e.type == "step_started"]
    assert started == ["s0", "s2"]


async def test_group_writes_off_writes_each_alone(pg_dsn: str, listen: Notifications) -> None:
    """TREADLE_DATABASE_GROUP_WRITES=false: concurrent writes queue on the row, one
    transaction (one notification) each."""
    async with await PostgresStorage.connect(pg_dsn, pool_size=4, group_writes=False) as storage:
        run_id = await _run_with_steps(storage)
        await listen.until(f"{run_id}:{STEPS + 1}")
        starts: list[events.Event] = [
            events.StepStarted(correlation_id=f"s{i}", step_name="f", attempt=1) for i in range(8)
        ]
        heard = await _heard_for(
            listen, storage, run_id, lambda: _concurrently(storage, run_id, starts)
        )
        assert sorted(heard) == sorted(f"{run_id}:{STEPS + 2 + i}" for i in range(8))
        assert storage.events.combiner.groups == 0  # type: ignore[attr-defined]
