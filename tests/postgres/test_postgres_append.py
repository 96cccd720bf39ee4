"""The Postgres append: one statement per write, races, long reports, what JSONB cannot hold."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from treadle import errors
from treadle.world import constants, events
from treadle.worlds.postgres import PostgresStorage

# Every asyncpg call that sends a statement to the server.
_STATEMENT_METHODS = ("execute", "executemany", "fetch", "fetchrow", "fetchval", "fetchmany")


@pytest.fixture
async def storage(pg_dsn: str) -> AsyncIterator[PostgresStorage]:
    opened = await PostgresStorage.connect(pg_dsn, pool_size=8)
    try:
        yield opened
    finally:
        await opened.close()


async def _started(storage: PostgresStorage) -> str:
    run = await storage.runs.create(
        workflow_name="wf", input=None, deployment_id="d", spec_version=9
    )
    await storage.events.create(
        run.run_id, events.RunStarted(), in_band=True, expected_seq_in_band=1, event_count=1
    )
    return run.run_id


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements asyncpg sends (and prepares) from here on, in order."""
    sent: list[str] = []

    def counting(
        name: str, original: Callable[..., Coroutine[Any, Any, Any]]
    ) -> Callable[..., Coroutine[Any, Any, Any]]:
        @functools.wraps(original)
        async def wrapper(self: asyncpg.Connection, query: str, *args: Any, **kw: Any) -> Any:
            sent.append(f"{name}: {query}")
            return await original(self, query, *args, **kw)

        return wrapper

    for name in (*_STATEMENT_METHODS, "prepare"):
        original = getattr(asyncpg.connection.Connection, name)
        monkeypatch.setattr(asyncpg.connection.Connection, name, counting(name, original))
    return sent


async def test_each_write_is_one_statement(storage: PostgresStorage, statements: list[str]) -> None:
    """events.create, create_batch and runs.create each send exactly one statement."""
    run_id = await _started(storage)
    del statements[:]
    result = await storage.events.create(
        run_id, events.AttrSet(key="a", value=1), in_band=True, expected_seq_in_band=2,
        event_count=2, occurred_at=datetime.now(UTC),
    )  # fmt: skip
    assert result.event.slot == 3
    assert len(statements) == 1 and "treadle_append" in statements[0], statements
    del statements[:]
    batch: list[events.Event] = [
        events.StepCreated(correlation_id=f"s{i}", step_name="f") for i in range(20)
    ]
    done = await storage.events.create_batch(
        run_id, batch, in_band=True, expected_seq_in_band=3, event_count=3
    )
    assert done.allocated == 20
    assert len(statements) == 1 and "treadle_append" in statements[0], statements
    del statements[:]
    with pytest.raises(errors.InBandSuperseded):
        await storage.events.create(
            run_id, events.Noop(), in_band=True, expected_seq_in_band=2, event_count=2
        )
    assert len(statements) == 1, statements
    del statements[:]
    await storage.runs.create(workflow_name="wf", input=None, deployment_id="d", spec_version=9)
    assert len(statements) == 1 and "treadle_create_run" in statements[0], statements


async def test_concurrent_claims_of_one_token_give_one_hook_and_conflicts(
    storage: PostgresStorage,
) -> None:
    """Runs racing for a token: one hook_created, the rest hook_conflict naming the holder."""
    runs = [await _started(storage) for _ in range(6)]
    results = await asyncio.gather(
        *(
            storage.events.create(
                run_id, events.HookCreated(correlation_id="h", token="contested"), in_band=False
            )
            for run_id in runs
        )
    )
    created = [r for r in results if r.event.type == "hook_created"]
    assert len(created) == 1
    holder = created[0].event.run_id
    conflicts = [r.event.event for r in results if r.event.type == "hook_conflict"]
    assert len(conflicts) == 5
    assert all(isinstance(c, events.HookConflict) and c.holder_run_id == holder for c in conflicts)
    assert (await storage.hooks.get_by_token("contested")).run_id == holder


async def test_concurrent_writers_leave_a_dense_log_and_exact_counters(
    storage: PostgresStorage,
) -> None:
    """Out-of-band writers and batches at once: every slot taken once, counters exact."""
    run_id = await _started(storage)
    singles = [
        storage.events.create(run_id, events.AttrSet(key=f"k{i}", value=i), in_band=False)
        for i in range(30)
    ]
    batches = [
        storage.events.create_batch(
            run_id,
            [events.StepCreated(correlation_id=f"b{i}_{j}", step_name="f") for j in range(5)],
            in_band=False,
        )
        for i in range(6)
    ]
    await asyncio.gather(*singles, *batches)
    page = await storage.events.list(run_id)
    assert [e.slot for e in page.events] == list(range(1, 63))
    assert (page.snapshot.seq, page.snapshot.seq_in_band) == (62, 2)
    assert len(await storage.steps.list(run_id)) == 30


async def test_a_report_longer_than_the_limit_says_has_more(storage: PostgresStorage) -> None:
    run_id = await _started(storage)
    for i in range(0, constants.MAX_SKIPPED_SLOT_REPORT + 5, constants.MAX_BATCH_EVENTS):
        await storage.events.create_batch(
            run_id,
            [
                events.WaitCompleted(correlation_id=f"w{i + j}")
                for j in range(constants.MAX_BATCH_EVENTS)
            ],
            in_band=False,
        )
    result = await storage.events.create(
        run_id, events.Noop(), in_band=True, expected_seq_in_band=2, event_count=2
    )
    assert result.has_more is True
    assert len(result.report) == constants.MAX_SKIPPED_SLOT_REPORT
    assert [e.slot for e in result.report] == list(range(3, 3 + constants.MAX_SKIPPED_SLOT_REPORT))


async def test_in_band_idempotent_retry_converges(storage: PostgresStorage) -> None:
    run_id = await _started(storage)
    write = functools.partial(
        storage.events.create, run_id, events.Noop(), in_band=True, expected_seq_in_band=2,
        event_count=2, idempotency_key="once",
    )  # fmt: skip
    first = await write()
    with pytest.raises(errors.InBandSuperseded):  # the fence is decided before the key
        await write()
    again = await storage.events.create(
        run_id, events.Noop(), in_band=True, expected_seq_in_band=3, event_count=3,
        idempotency_key="once",
    )  # fmt: skip
    assert (first.allocated, again.allocated, again.event) == (1, 0, first.event)


async def test_a_nul_character_is_refused_with_a_contract_error(storage: PostgresStorage) -> None:
    """JSONB holds no \\u0000: the write is refused (WorldContractError), allocating nothing."""
    run_id = await _started(storage)
    with pytest.raises(errors.WorldContractError, match="NUL"):
        await storage.events.create(
            run_id, events.AttrSet(key="k", value="a\u0000b"), in_band=False
        )
    assert (await storage.runs.get(run_id)).seq == 2
