"""Concurrency and rate limits, priorities (issue 17 item 4; ``docs/limits.md``).

Each test runs on both real Worlds (local, and Postgres + NATS). Order is asserted from
what the runs recorded (the order their bodies entered and left, the log's times against
the World's clock), never from how long anything took.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from treadle import FatalError, Limit, LimitKeyError, Rate, Run, Workflows, sleep
from treadle.cli import output
from treadle.errors import RunFailedError
from treadle.serve import views
from treadle.world import events

from .audit import assert_sound, cold_outcome
from .conftest import MakeApp

pytestmark = pytest.mark.parametrize("open_world", ["local", "postgres+nats"], indirect=True)


async def _until(check: Any, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"never {what}"
        await asyncio.sleep(0.02)  # polling the World's view of another task's progress


async def _waiting(run: Run) -> bool:
    return (await run.get()).waiting_on_limit is not None


async def _logged(run: Run, type_: str) -> events.LoggedEvent:
    return next(e for e in await run.events() if e.type == type_)


def _gated_app(make_app: MakeApp, **workflow_options: Any) -> tuple[Workflows, Any, list[str]]:
    """``job(customer, name)``: one step that logs its entry, waits for its gate, logs its exit."""
    app = make_app()
    seen: list[str] = []
    gates: dict[str, asyncio.Event] = {}

    def gate(name: str) -> asyncio.Event:
        return gates.setdefault(name, asyncio.Event())

    @app.step
    async def work(name: str) -> str:
        seen.append(f"{name} in")
        await gate(name).wait()
        seen.append(f"{name} out")
        return name

    @app.workflow(**workflow_options)
    async def job(customer: str, name: str) -> str:
        return await work(name)

    job.gate = gate  # type: ignore[attr-defined]
    return app, job, seen


async def test_max_one_serialises_one_key_while_another_key_runs(make_app: MakeApp) -> None:
    app, job, seen = _gated_app(
        make_app, concurrency=Limit(key=lambda customer, name: customer, max=1)
    )
    a1 = await app.start(job, "acme", "a1")
    await _until(lambda: _has(seen, "a1 in"), "a1 entered")
    a2 = await app.start(job, "acme", "a2")
    b1 = await app.start(job, "bolt", "b1")
    await _until(lambda: _has(seen, "b1 in"), "b1 entered while a1 held acme")
    job.gate("b1").set()
    assert await b1.result(timeout=20) == "b1"
    record = await a2.get()  # a1 still holds acme's one slot: a2 waits on it
    assert record.status == "pending" and record.waiting_on_limit is not None
    wait = record.waiting_on_limit
    assert (wait.limit, wait.scope, wait.key, wait.position) == (
        "concurrency",
        "workflow:job",
        "acme",
        1,
    )
    assert "a2 in" not in seen
    shown = output.run_dict(record)["waiting_on_limit"]  # treadle runs get --json
    assert (shown["key"], shown["position"]) == ("acme", 1)
    assert output.status_text(record) == "pending (waiting on concurrency)"  # runs list
    assert views.summary(record).waiting_on_limit.key == "acme"  # type: ignore[union-attr]
    job.gate("a1").set()
    job.gate("a2").set()
    assert await a1.result(timeout=20) == "a1"
    assert await a2.result(timeout=20) == "a2"
    assert seen.index("a1 out") < seen.index("a2 in")
    assert seen.index("b1 in") < seen.index("a1 out")  # the other key ran in parallel
    # The log agrees: a2 started only after a1 ended.
    ended = await _logged(a1, "run_completed")
    started = await _logged(a2, "run_started")
    assert started.created_at >= ended.created_at
    assert (await a2.get()).waiting_on_limit is None
    for run, name in ((a1, "a1"), (a2, "a2"), (b1, "b1")):
        assert cold_outcome(job, await assert_sound(run)) == ("completed", name)


async def _has(seen: list[str], line: str) -> bool:
    return line in seen


async def test_priorities_order_the_waiters_fifo_within_one(make_app: MakeApp) -> None:
    app, job, seen = _gated_app(make_app, concurrency=Limit(max=1))
    holder = await app.start(job, "c", "holder")
    await _until(lambda: _has(seen, "holder in"), "the holder entered")
    order = [("low1", 0), ("high1", 5), ("low2", 0), ("high2", 5), ("top", 9)]
    runs = []
    for name, priority in order:
        run = await app.start(job, "c", name, priority=priority)
        job.gate(name).set()
        runs.append(run)
    for run in runs:
        await _until(lambda run=run: _waiting(run), f"{run} shown waiting")
    names = [name for name, _ in order]
    positions = {
        name: (await run.get()).waiting_on_limit for name, run in zip(names, runs, strict=True)
    }
    assert {n: w.position for n, w in positions.items() if w} == {
        "top": 1, "high1": 2, "high2": 3, "low1": 4, "low2": 5,
    }  # fmt: skip
    job.gate("holder").set()
    for run in [holder, *runs]:
        await run.result(timeout=30)
    entered = [line.split()[0] for line in seen if line.endswith(" in")]
    assert entered == ["holder", "top", "high1", "high2", "low1", "low2"]


@pytest.mark.parametrize("ending", ["failed", "cancelled"])
async def test_a_failed_or_cancelled_holder_releases_its_slot(
    make_app: MakeApp, ending: str
) -> None:
    app = make_app()
    entered: list[str] = []
    gate = asyncio.Event()

    @app.step(max_retries=0)
    async def hold(name: str) -> str:
        entered.append(name)
        if name == "first":
            await gate.wait()
            if ending == "failed":
                raise FatalError("boom")
        return name

    @app.workflow(concurrency=Limit(max=1, key=lambda name: "one"))
    async def holder(name: str) -> str:
        done = await hold(name)
        if name == "first":
            await sleep("1h")
        return done

    first = await app.start(holder, "first")
    await _until(lambda: _has(entered, "first"), "the first run entered")
    second = await app.start(holder, "second")
    await _until(lambda: _waiting(second), "the second shown waiting")
    gate.set()
    if ending == "failed":
        with pytest.raises(RunFailedError):
            await first.result(timeout=20)
    else:
        await _until(lambda: _logged_any(first, "wait_created"), "the first sleeping")
        assert await _waiting(second)
        await first.cancel()
    assert await second.result(timeout=20) == "second"
    assert entered == ["first", "second"]
    assert (await first.get()).status == ending


async def _logged_any(run: Run, type_: str) -> bool:
    return any(e.type == type_ for e in await run.events())


async def test_a_cancelled_waiter_leaves_the_queue(make_app: MakeApp) -> None:
    app, job, seen = _gated_app(make_app, concurrency=Limit(max=1))
    holder = await app.start(job, "c", "holder")
    await _until(lambda: _has(seen, "holder in"), "the holder entered")
    gone = await app.start(job, "c", "gone")
    kept = await app.start(job, "c", "kept")
    await _until(lambda: _waiting(kept), "kept shown waiting")
    await gone.cancel()
    assert (await kept.get()).waiting_on_limit.position == 1  # type: ignore[union-attr]
    for name in ("holder", "kept"):
        job.gate(name).set()
    await holder.result(timeout=20)
    assert await kept.result(timeout=20) == "kept"
    assert "gone in" not in seen and (await gone.get()).status == "cancelled"


async def test_a_rate_spaces_starts_by_the_worlds_clock(make_app: MakeApp) -> None:
    app = make_app()
    per_second = 5  # one start per 200 ms

    @app.workflow(rate=Rate(key=lambda n: "k", per_second=per_second))
    async def tick(n: int) -> int:
        return n

    first_start_ms = time.time() * 1000  # the World's clock (local: the host's; pg: its own)
    runs = [await app.start(tick, n) for n in range(5)]
    for run in runs:
        await run.result(timeout=30)
    starts = sorted([
        (await _logged(run, "run_started")).created_at.timestamp() * 1000 for run in runs
    ])  # fmt: skip
    interval = 1000 / per_second
    for k, at in enumerate(starts):
        # At most k + 1 starts by first_start + k intervals (burst 1): never more per window.
        assert at >= first_start_ms + k * interval - 5, (k, at - first_start_ms)


async def test_a_step_limit_serialises_its_key_and_runs_others(make_app: MakeApp) -> None:
    app = make_app()
    seen: list[str] = []
    b_done = asyncio.Event()

    @app.step(concurrency=Limit(key=lambda key, n: key, max=1))
    async def call(key: str, n: int) -> str:
        seen.append(f"{key}{n} in")
        if key == "a" and n == 0:
            await b_done.wait()  # key b must run while a's slot is held
        await asyncio.sleep(0)
        seen.append(f"{key}{n} out")
        if key == "b":
            b_done.set()
        return f"{key}{n}"

    @app.workflow
    async def fan() -> list[str]:
        return list(await asyncio.gather(call("a", 0), call("a", 1), call("a", 2), call("b", 0)))

    run = await app.start(fan)
    assert await run.result(timeout=30) == ["a0", "a1", "a2", "b0"]
    a_lines = [line for line in seen if line.startswith("a")]
    for i in range(0, len(a_lines), 2):  # no two bodies of key a at once
        assert a_lines[i].endswith(" in") and a_lines[i + 1] == a_lines[i].replace("in", "out")
    assert seen.index("b0 in") < seen.index("a0 out")
    log = await assert_sound(run)
    created = [e for e in log if e.type == "step_created"]
    assert len(created) == 4 and all(not e.event.inline for e in created)  # type: ignore[union-attr]
    # Replayed cold from its log, the run decides the same: the limits left no trace in it.
    assert cold_outcome(fan, log) == ("completed", ["a0", "a1", "a2", "b0"])


async def test_a_step_rate_spaces_its_attempts(make_app: MakeApp) -> None:
    app = make_app()

    @app.step(rate=Rate(per_second=10))
    async def ping(n: int) -> int:
        return n

    @app.workflow
    async def pings() -> int:
        return sum(await asyncio.gather(*(ping(n) for n in range(4))))

    began = time.time() * 1000
    run = await app.start(pings)
    assert await run.result(timeout=30) == 6
    starts = sorted(
        e.created_at.timestamp() * 1000 for e in await run.events() if e.type == "step_started"
    )
    assert len(starts) == 4
    for k, at in enumerate(starts):
        assert at >= began + k * 100 - 5, (k, at - began)


async def test_a_key_the_input_cannot_give_is_refused_at_start(make_app: MakeApp) -> None:
    app = make_app()

    @app.workflow(concurrency=Limit(key=lambda order: order["customer"], max=1))
    async def by_customer(order: dict[str, str]) -> str:
        return "ran"

    @app.workflow(rate=Rate(key=lambda n: n, per_minute=60))
    async def numbered(n: int) -> int:
        return n

    with pytest.raises(LimitKeyError, match=r"workflow by_customer.*concurrency key.*KeyError"):
        await app.start(by_customer, {"id": "o-1"})
    with pytest.raises(LimitKeyError, match=r"workflow numbered.*rate key.*int, not a string"):
        await app.start(numbered, 3)
    world = await app.world()
    assert (await world.runs.list()).runs == ()  # nothing recorded


async def test_a_step_key_the_input_cannot_give_fails_at_the_call(make_app: MakeApp) -> None:
    app = make_app()

    @app.step(concurrency=Limit(key=lambda n: None, max=2))  # type: ignore[arg-type,return-value]
    async def bad(n: int) -> int:
        return n

    @app.workflow
    async def caller() -> str:
        try:
            await bad(1)
        except LimitKeyError as exc:
            return str(exc)
        return "no error"

    run = await app.start(caller)
    message = await run.result(timeout=20)
    assert "step bad" in message and "concurrency key" in message and "NoneType" in message
    log = await assert_sound(run)
    assert not [e for e in log if e.type.startswith("step_")]
    assert cold_outcome(caller, log) == ("completed", message)  # raised the same on replay
