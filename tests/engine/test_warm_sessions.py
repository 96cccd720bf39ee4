"""Warm replay sessions (issue 15 item 5; ``treadle.orchestrator.warm``): a suspended
run's next delivery in the same process reads only the log after what it kept, and
goes cold (loads and replays the whole log, as before) whenever it cannot continue.

Each test runs on the local World and on Postgres + NATS, through ``faults.FaultyWorld``,
which counts the events every log read returns and the delivery that made it. Every
resume is a new delivery: the linger is 0, as in the benchmark's ``history`` scenario.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from treadle import Hook, Workflows, clock, errors
from treadle.orchestrator import warm
from treadle.orchestrator.delivery import OrchestratorDelivery
from treadle.orchestrator.runtime import Runtime
from treadle.world import events, messages

from .conftest import MakeApp
from .faults import FaultyWorld, Started


class Go(Hook):
    n: int


def _app(make_app: MakeApp, faulty: FaultyWorld, **settings: Any) -> tuple[Workflows, Any]:
    app = make_app(world=faulty, WORKFLOW_ORCHESTRATOR_LINGER_MS=0, **settings)

    @app.step
    async def work(i: int) -> int:
        return i

    @app.workflow
    async def long(tag: str, steps: int, hooks: int) -> int:
        total = 0
        for i in range(steps):
            total += await work(i)
        for j in range(hooks):
            got = await Go.wait(token=f"{tag}-{j}")
            total += got.n + await work(steps + j)
        return total

    return app, long


def _expected(steps: int, hooks: int) -> int:
    return sum(range(steps)) + sum(100 + j + steps + j for j in range(hooks))


def _rt(app: Workflows) -> Runtime:
    assert app._worker is not None
    return app._worker.rt


async def _resume(app: Workflows, faulty: FaultyWorld, token: str, n: int) -> None:
    """Resume ``token`` once its hook exists (waiting on the World's recorded writes)."""
    async with asyncio.timeout(60):
        while True:
            seen = len(faulty.trace)
            try:
                await app.resume_hook(token, Go(n=n))
                return
            except errors.HookNotFound:
                await faulty.queue.until(lambda seen=seen: len(faulty.trace) > seen)


async def _kept(app: Workflows, faulty: FaultyWorld, run_id: str) -> None:
    """Until the worker keeps a warm session of ``run_id`` (its delivery answered)."""
    await faulty.queue.until(lambda: run_id in _rt(app).warm)


def _reads_by_delivery(faulty: FaultyWorld, since: int = 0) -> dict[int, tuple[Started, int]]:
    """Orchestrator deliveries (in order of their reads) and the events their reads
    returned in all, from read number ``since`` on."""
    out: dict[int, tuple[Started, int]] = {}
    for n, by in faulty.events.events_read[since:]:
        if by is None or by.kind != "orchestrator":
            continue
        _, total = out.get(id(by), (by, 0))
        out[id(by)] = (by, total + n)
    return out


def _hooks(faulty: FaultyWorld) -> int:
    """Hooks created so far (the in-band ``hook_created`` writes recorded)."""
    return sum(1 for t in faulty.trace if t.what == "write" and t.name == "hook_created")


def _all_answered(faulty: FaultyWorld, run_id: str) -> bool:
    """Every orchestrator delivery of ``run_id`` started so far has answered."""
    mine = [
        s.meta
        for s in faulty.queue.started
        if s.kind == "orchestrator" and s.message.run_id == run_id
    ]
    answered = [a.meta for a in faulty.queue.orchestrator_answers()]
    return bool(mine) and all(any(m is a for a in answered) for m in mine)


def _stats() -> Counter[str]:
    s = warm.STATS
    return Counter({"kept": s.kept, "resumed": s.resumed, "evicted": s.evicted, **s.cold})


async def test_resumes_of_a_long_run_read_only_the_tail(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """A run of 150 inline steps (a log past 300 events) resumed 4 times: each resume's
    delivery reads a handful of events, not the log; the run ends right and keeps no
    session once it ended."""
    steps, hooks = 150, 4
    app, long = _app(make_app, faulty)
    before = _stats()
    run = await app.start(long, "long", steps, hooks)
    for j in range(hooks):
        await faulty.queue.until(lambda j=j: _hooks(faulty) >= j + 1)  # suspended on hook j
        await _kept(app, faulty, run.run_id)
        mark = len(faulty.events.events_read)
        await _resume(app, faulty, f"long-{j}", 100 + j)
        if j + 1 < hooks:
            await faulty.queue.until(lambda j=j: _hooks(faulty) >= j + 2)
            await _kept(app, faulty, run.run_id)  # that delivery made every read it makes
        else:
            assert await run.result(timeout=60) == _expected(steps, hooks)
        reads = _reads_by_delivery(faulty, mark)
        assert reads, "the resume made no orchestrator delivery"
        record = await faulty.inner.runs.get(run.run_id)
        assert record.seq > 2 * steps
        most = max(total for _, total in reads.values())
        assert most <= 4, f"a resume's delivery read {most} events (the log holds {record.seq})"
    gained = _stats() - before
    assert gained["resumed"] >= hooks, gained
    assert run.run_id not in _rt(app).warm  # the run ended: its session is gone


async def test_a_run_another_process_advanced_goes_cold(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """The worker keeps the run's session; while its next delivery is held, another
    process (a second Runtime, with a cache of its own) delivers the resume and advances
    the run in-band. The held delivery then finds in-band events after its session: it
    drops it, loads the whole log, and the run still ends right, every step once."""
    steps, hooks = 30, 3
    app, long = _app(make_app, faulty)
    run = await app.start(long, "stale", steps, hooks)
    await _kept(app, faulty, run.run_id)
    release = asyncio.Event()
    held_from = len(faulty.queue.started)
    faulty.queue.hold_deliveries(lambda s: s.kind == "orchestrator", release)
    await _resume(app, faulty, "stale-0", 100)
    await faulty.queue.until(lambda: len(faulty.queue.started) > held_from)
    other = app.runtime(faulty)  # another worker process: its own (empty) cache
    assert run.run_id not in other.warm
    wake = other.wake_message(run.run_id, other.deployment_id, spec_version=9)
    meta = messages.DeliveryMeta(
        message_id="other-process", delivery_count=1, attempt=1,
        invocation_started_at=clock.now_ms(),
    )  # fmt: skip
    assert await OrchestratorDelivery(other, wake, meta).run() == messages.ACK
    assert run.run_id in other.warm  # the other process keeps its own now
    before = _stats()
    mark = len(faulty.events.events_read)
    release.set()
    await faulty.queue.until(lambda: _stats()["in_band_since"] > before["in_band_since"])
    await _kept(app, faulty, run.run_id)
    record = await faulty.inner.runs.get(run.run_id)
    cold = max(total for _, total in _reads_by_delivery(faulty, mark).values())
    assert cold >= record.seq - 1, f"the stale delivery read {cold} of {record.seq} events"
    for j in range(1, hooks):
        await _resume(app, faulty, f"stale-{j}", 100 + j)
    assert await run.result(timeout=60) == _expected(steps, hooks)
    log = await _log(faulty, run.run_id)
    starts = Counter(
        e.event.position for e in log if isinstance(e.event, events.StepStarted) and e.event.inline
    )
    assert starts and max(starts.values()) == 1, "a step was started twice"
    other.warm.clear()


async def test_sessions_are_bounded_by_count_and_events(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """TREADLE_WARM_RUNS=2: a third suspended run evicts the least recently kept, whose
    next delivery goes cold; TREADLE_WARM_EVENTS: a run holding more events than the
    bound is never kept. Every run that ended holds no session."""
    app, long = _app(make_app, faulty, TREADLE_WARM_RUNS=2, TREADLE_WARM_EVENTS=60)
    before = _stats()
    runs = {}
    for tag in ("a", "b", "c"):
        runs[tag] = await app.start(long, tag, 3, 2)
        await _kept(app, faulty, runs[tag].run_id)
    cache = _rt(app).warm
    assert runs["a"].run_id not in cache
    assert runs["b"].run_id in cache and runs["c"].run_id in cache
    assert len(cache) == 2 and (_stats() - before)["evicted"] >= 1
    # The evicted run's resume goes cold: it reads its whole log.
    mark = len(faulty.events.events_read)
    await _resume(app, faulty, "a-0", 100)
    await faulty.queue.until(lambda: runs["b"].run_id not in cache)  # a kept again: b out
    record = await faulty.inner.runs.get(runs["a"].run_id)
    read = max(total for _, total in _reads_by_delivery(faulty, mark).values())
    assert read >= record.seq - 2, f"the evicted run's resume read only {read} events"
    # Too long for TREADLE_WARM_EVENTS: never kept (its delivery answered all the same).
    big = await app.start(long, "big", 40, 1)
    await faulty.queue.until(lambda: _hooks(faulty) >= 5 and _all_answered(faulty, big.run_id))
    assert big.run_id not in cache and cache.events <= 60
    await _resume(app, faulty, "big-0", 100)
    for tag in ("a", "b", "c"):
        for j in range(2):
            if (tag, j) != ("a", 0):
                await _resume(app, faulty, f"{tag}-{j}", 100 + j)
    for run in runs.values():
        assert await run.result(timeout=60) == _expected(3, 2)
    assert await big.result(timeout=60) == _expected(40, 1)
    assert len(cache) == 0 and cache.events == 0


async def test_warm_runs_zero_restores_cold_replay(make_app: MakeApp, faulty: FaultyWorld) -> None:
    """TREADLE_WARM_RUNS=0: nothing is kept, and every resume loads the whole log."""
    steps, hooks = 40, 2
    app, long = _app(make_app, faulty, TREADLE_WARM_RUNS=0)
    before = _stats()
    run = await app.start(long, "off", steps, hooks)
    for j in range(hooks):
        mark = len(faulty.events.events_read)
        await _resume(app, faulty, f"off-{j}", 100 + j)
        if j + 1 < hooks:
            await faulty.queue.until(
                lambda j=j, mark=mark: (
                    _hooks(faulty) >= j + 2 and bool(_reads_by_delivery(faulty, mark))
                )
            )
        else:
            assert await run.result(timeout=60) == _expected(steps, hooks)
        reads = _reads_by_delivery(faulty, mark)
        record = await faulty.inner.runs.get(run.run_id)
        assert max(total for _, total in reads.values()) >= 2 * steps
        assert record.seq > 2 * steps
    assert len(_rt(app).warm) == 0
    gained = _stats() - before
    assert gained["kept"] == 0 and gained["resumed"] == 0


async def _log(faulty: FaultyWorld, run_id: str) -> list[events.LoggedEvent]:
    out: list[events.LoggedEvent] = []
    after = 0
    while True:
        page = await faulty.inner.events.list(run_id, after_slot=after)
        out.extend(page.events)
        if not page.has_more:
            return out
        after = page.cursor


async def test_a_turbo_started_run_with_attributes_resumes_warm(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Turbo's first delivery takes the log as a ``run_created`` made from the run's
    record; with the run's attributes in it (every schedule's run has some), the session
    it keeps is the log's own, so the next delivery resumes it instead of going cold
    ("synthesized": slot 1 unlike the log)."""
    app, long = _app(make_app, faulty)
    before = _stats()
    run = await app.start(long, "attrs", 3, 1, attributes={"customer": "acme"})
    await faulty.queue.until(lambda: _hooks(faulty) >= 1)
    await _kept(app, faulty, run.run_id)
    kept = _rt(app).warm.sessions()
    assert any(k.run_id == run.run_id and k.synthesized for k in kept), "turbo did not start it"
    await _resume(app, faulty, "attrs-0", 100)
    assert await run.result(timeout=60) == _expected(3, 1)
    gained = _stats() - before
    assert gained["resumed"] >= 1 and gained["synthesized"] == 0, gained
    log = await _log(faulty, run.run_id)
    created = log[0].event
    assert isinstance(created, events.RunCreated) and created.attributes == {"customer": "acme"}
