"""Optimistic starts (issue 15 item 2; seed 003 "Turbo", "Background body before a
refused start", "Rotated start message re-entering turbo").

Turbo's early inline bodies: on the start message's first delivery an all-inline
boundary's bodies start before their ``step_started`` commits (queued behind the
backgrounded ``run_started``), never a ``max_retries=0`` one, until the first hook or
wait; a refused ``run_started`` discards their outcomes and decides the delivery. And
``WORKFLOW_OPTIMISTIC_BACKGROUND_START``: a background step's body while its start is
in flight, its outcome written only once the start committed.

Every test runs on both real Worlds (local SQLite, and Postgres + NATS on real
servers) through ``FaultyWorld``. Ordering is proven by a gated World write (the
write is held until the body says it runs: a body that waited for that write would
never run, so the hold's bound runs out and the test fails) or by the body reading
the log at its start; which bodies the engine started early is recorded from
``InlineSteps.start_early`` itself.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from treadle import sleep
from treadle.errors import RunCancelledError, RunExpired
from treadle.orchestrator import inline as inline_module
from treadle.replay import operations
from treadle.world import events, messages

from .audit import assert_sound, types
from .conftest import MakeApp
from .faults import CURRENT, FaultyWorld
from .optimistic import (
    HOLD_BOUND_SECONDS,
    TURBO_ONLY,
    Ping,
    hold_writes,
    is_inline_start,
    is_run_started,
    own_start_in_log,
)


@pytest.fixture
def early(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every inline body the engine started before its start: (step name, delivery count)."""
    started: list[tuple[str, int]] = []
    real = inline_module.InlineSteps.start_early

    def recorded(
        self: inline_module.InlineSteps, call: operations.StepCall, gate: asyncio.Future[bool]
    ) -> None:
        started.append((call.step_name, self.meta.delivery_count))
        real(self, call, gate)

    monkeypatch.setattr(inline_module.InlineSteps, "start_early", recorded)
    return started


def _count_loads(world: FaultyWorld) -> list[int]:
    """The delivery count of each orchestrator full log load (a list from slot 0)."""
    loads: list[int] = []
    inner = world.events.list

    async def listed(run_id: str, **kw: Any) -> Any:
        current = CURRENT.get()
        if current is not None and current.kind == "orchestrator" and not kw.get("after_slot"):
            loads.append(current.meta.delivery_count)
        return await inner(run_id, **kw)

    world.events.list = listed  # type: ignore[method-assign]
    return loads


# -- turbo's early inline bodies ---------------------------------------------------------


async def test_first_bodies_start_before_run_started_and_their_starts_commit(
    make_app: MakeApp, faulty: FaultyWorld, early: list[tuple[str, int]]
) -> None:
    """Seed 003 "Turbo": a's body starts while run_started (held at the World until a's
    body runs) is in flight, so it reads a log of run_created alone; b's body starts
    while its own step_started is held the same way. Both outcomes are written after
    their starts, and the log reads run_created, run_started, step_started a, ...

    Seen to fail: ``OptimisticStarts.boundary`` returning False (every body waits for
    its start): run_started is never released by a body, the hold's bound runs out."""
    gate_run = hold_writes(faulty, is_run_started)
    gate_b = hold_writes(faulty, is_inline_start("b"))
    app = make_app(world=faulty, **TURBO_ONLY)
    seen: dict[str, list[str]] = {}

    @app.step
    async def a() -> str:
        current = CURRENT.get()
        assert current is not None
        page = await faulty.events.list(current.message.run_id)
        seen["a"] = [e.type for e in page.events]
        gate_run.release.set()
        return "a"

    @app.step
    async def b(x: str) -> str:
        seen["b"] = ["own start" if await own_start_in_log(faulty, "b") else "no start"]
        gate_b.release.set()
        return x + "b"

    @app.workflow
    async def flow() -> str:
        return await b(await a())

    run = await app.start(flow)
    assert await run.result(timeout=30) == "ab"
    assert gate_run.timed_out == [] and gate_b.timed_out == [], "a body waited for its start"
    assert seen == {"a": ["run_created"], "b": ["no start"]}
    assert early == [("a", 1), ("b", 1)]
    log = await assert_sound(run)
    assert types(log) == [
        "run_created",
        "run_started",
        "step_started",
        "step_completed",
        "step_started",
        "step_completed",
        "run_completed",
    ]


async def test_a_max_retries_0_step_waits_for_its_start(
    make_app: MakeApp, faulty: FaultyWorld, early: list[tuple[str, int]]
) -> None:
    """Seed 003 ``mayRunBeforeItsStart``: in one all-inline boundary, ``r3`` (retries
    allowed) starts early and releases run_started; ``r0`` (max_retries=0) waits for its
    start to commit, so its body finds its step_started in the log.

    Seen to fail: ``turbo.may_run_before_its_start`` answering True for 0: r0 starts
    with r3, while run_started is still held, and reads no start of its own."""
    gate = hold_writes(faulty, is_run_started)
    app = make_app(world=faulty, **TURBO_ONLY)
    seen: dict[str, bool] = {}

    @app.step(max_retries=0)
    async def r0() -> str:
        seen["r0"] = await own_start_in_log(faulty, "r0")
        return "0"

    @app.step
    async def r3() -> str:
        seen["r3"] = await own_start_in_log(faulty, "r3")
        gate.release.set()
        return "3"

    @app.workflow
    async def flow() -> list[str]:
        return list(await asyncio.gather(r0(), r3()))

    run = await app.start(flow)
    assert await run.result(timeout=30) == ["0", "3"]
    assert gate.timed_out == []
    assert seen == {"r0": True, "r3": False}
    assert early == [("r3", 1)]
    await assert_sound(run)


async def test_a_hook_ends_optimistic_starts_for_the_rest_of_the_delivery(
    make_app: MakeApp, faulty: FaultyWorld, early: list[tuple[str, int]]
) -> None:
    """Seed 003 "Turbo stops on the first hook or wait": a starts early; the workflow
    then waits on a hook, resumed while the same first delivery lingers; b, run by that
    delivery, waits for its start (its body finds it in the log).

    Seen to fail: ``OptimisticStarts.end`` made a no-op: b is started early too."""
    app = make_app(world=faulty, **TURBO_ONLY, WORKFLOW_ORCHESTRATOR_LINGER_MS=8000)
    ran: dict[str, tuple[int, str]] = {}
    own: dict[str, bool] = {}

    def where() -> tuple[int, str]:
        current = CURRENT.get()
        assert current is not None
        return current.meta.delivery_count, current.meta.message_id

    @app.step
    async def a() -> str:
        ran["a"] = where()
        return "a"

    @app.step
    async def b(x: str) -> str:
        ran["b"] = where()
        own["b"] = await own_start_in_log(faulty, "b")
        return x + "b"

    @app.workflow
    async def flow() -> str:
        got = await a()
        ping = await Ping.wait(token="tb-hook-ends")
        return await b(got + str(ping.n))

    run = await app.start(flow)
    await faulty.queue.until(lambda: any(t.name == "hook_created" for t in faulty.trace))
    await app.resume_hook("tb-hook-ends", Ping(n=1))
    assert await run.result(timeout=30) == "a1b"
    assert ran["a"] == ran["b"], "b ran in the first delivery, which lingered on the hook"
    assert own == {"b": True}
    assert early == [("a", 1)]
    await assert_sound(run)


async def test_a_boundary_with_a_wait_is_not_started_early(
    make_app: MakeApp, faulty: FaultyWorld, early: list[tuple[str, int]]
) -> None:
    """Seed 003: the optimistic start applies only while the boundary has no wait; a
    suspension with a wait ends it. ``gather(a(), sleep(...))``: a waits for its start,
    and so does b after the sleep.

    Seen to fail: ``OptimisticStarts.boundary`` without its hook-or-wait check."""
    app = make_app(world=faulty, **TURBO_ONLY)
    own: dict[str, bool] = {}

    @app.step
    async def a() -> str:
        own["a"] = await own_start_in_log(faulty, "a")
        return "a"

    @app.step
    async def b() -> str:
        own["b"] = await own_start_in_log(faulty, "b")
        return "b"

    @app.workflow
    async def flow() -> str:
        got, _ = await asyncio.gather(a(), sleep(0.2))
        return got + await b()

    run = await app.start(flow)
    assert await run.result(timeout=30) == "ab"
    assert own == {"a": True, "b": True}
    assert early == []
    await assert_sound(run)


async def test_a_boundary_with_a_background_step_commits_its_creations_first(
    make_app: MakeApp, faulty: FaultyWorld, early: list[tuple[str, int]]
) -> None:
    """Seed 003: "A boundary with a background step commits its creations first". With
    one inline slot, ``gather(a(), b())`` runs a inline and leaves b to its message: a
    waits for its start (finds it in the log), and neither starts early. (c runs in the
    first delivery or a later one, as b's wake comes: early only in the first.)

    Seen to fail: ``OptimisticStarts.boundary`` without its ``len(calls) <= slots``
    check: a starts early."""
    app = make_app(world=faulty, **TURBO_ONLY, WORKFLOW_MAX_INLINE_STEPS=1)
    own: dict[str, bool] = {}

    @app.step
    async def a() -> str:
        own["a"] = await own_start_in_log(faulty, "a")
        return "a"

    @app.step
    async def b() -> str:
        return "b"

    @app.step
    async def c(x: str) -> str:
        return x + "c"

    @app.workflow
    async def flow() -> str:
        got = "".join(await asyncio.gather(a(), b()))
        return await c(got)

    run = await app.start(flow)
    assert await run.result(timeout=30) == "abc"
    assert own == {"a": True}
    assert [name for name, _ in early if name in ("a", "b")] == []
    log = await assert_sound(run)
    created = [e.event for e in log if isinstance(e.event, events.StepCreated)]
    assert [e.step_name for e in created] == ["b"], "b ran from its own message"


async def test_a_boundary_with_a_step_that_failed_to_serialize_is_not_started_early(
    make_app: MakeApp, faulty: FaultyWorld, early: list[tuple[str, int]]
) -> None:
    """Seed 003: the optimistic start applies only while the boundary has "no step that
    failed to serialize". ``gather(a(), bad(object()))``: bad is created failed, and a
    waits for its start.

    Seen to fail: ``OptimisticStarts.boundary`` without its ``input_error`` check."""
    app = make_app(world=faulty, **TURBO_ONLY)
    own: dict[str, bool] = {}

    @app.step
    async def a() -> str:
        own["a"] = await own_start_in_log(faulty, "a")
        return "a"

    @app.step
    async def bad(x: Any) -> str:
        return "never"

    @app.workflow
    async def flow() -> str:
        got, failed = await asyncio.gather(a(), bad(object()), return_exceptions=True)
        return f"{got}:{type(failed).__name__}"

    run = await app.start(flow)
    result = await run.result(timeout=30)
    assert result.startswith("a:"), result
    assert own == {"a": True} and early == []
    await assert_sound(run)


async def test_a_run_cancelled_before_run_started_runs_the_body_and_writes_nothing(
    make_app: MakeApp, faulty: FaultyWorld, early: list[tuple[str, int]]
) -> None:
    """Seed 003 "A run cancelled before its first delivery still runs the first step
    body": the delivery read a pending record (turbo), then the run is cancelled while
    run_started is held. The early body runs once; run_started is refused (the run
    ended), which stops the writer: the start batch and the outcome are never written,
    and the delivery acknowledges. The log is run_created, run_cancelled."""
    gate = hold_writes(faulty, is_run_started)
    app = make_app(world=faulty, **TURBO_ONLY)
    ran: Counter[str] = Counter()
    entered = asyncio.Event()

    @app.step
    async def work() -> str:
        ran["work"] += 1
        entered.set()
        return "w"

    @app.workflow
    async def flow() -> str:
        return await work()

    run = await app.start(flow)
    await asyncio.wait_for(entered.wait(), HOLD_BOUND_SECONDS)
    await run.cancel()
    gate.release.set()
    await faulty.queue.until(lambda: bool(faulty.queue.orchestrator_answers()))
    (answer,) = faulty.queue.orchestrator_answers()
    assert answer.error is None and answer.result == messages.ACK
    with pytest.raises(RunCancelledError):
        await run.result(timeout=10)
    assert types(await assert_sound(run)) == ["run_created", "run_cancelled"]
    assert ran == Counter(work=1) and early == [("work", 1)]


async def test_any_refusal_of_run_started_stops_every_write_queued_behind_it(
    make_app: MakeApp, faulty: FaultyWorld, early: list[tuple[str, int]]
) -> None:
    """Seed 003 "If the backgrounded run_started fails for any reason, a definite refusal
    included, the in-band writer stops": the World refuses turbo's run_started with a
    business refusal (RunExpired) although the run is still pending, after the early
    body ran. Neither the start batch nor the outcome is written (the log stays
    run_created), and the refusal decides the delivery: acknowledged.

    Seen to fail: turbo's run_started written without ``required=True``: the writer
    keeps its count after a business refusal, and the start batch and the outcome are
    written on a run that never started."""
    app = make_app(world=faulty, **TURBO_ONLY)
    ran: Counter[str] = Counter()
    inner = faulty.events.create
    refused: list[str] = []

    async def create(run_id: str, event: events.Event, **kw: Any) -> Any:
        if event.type == "run_started" and not refused:
            await asyncio.wait_for(entered.wait(), HOLD_BOUND_SECONDS)
            refused.append(run_id)
            raise RunExpired(run_id, status="cancelled", event_type=event.type)
        return await inner(run_id, event, **kw)

    faulty.events.create = create  # type: ignore[method-assign]
    entered = asyncio.Event()

    @app.step
    async def work() -> str:
        ran["work"] += 1
        entered.set()
        return "w"

    @app.workflow
    async def flow() -> str:
        return await work()

    run = await app.start(flow)
    await faulty.queue.until(lambda: bool(faulty.queue.orchestrator_answers()))
    (answer,) = faulty.queue.orchestrator_answers()
    assert answer.error is None and answer.result == messages.ACK
    assert refused == [run.run_id]
    assert types(await run.events()) == ["run_created"]
    assert ran == Counter(work=1) and early == [("work", 1)]
    await run.cancel()


async def test_a_fence_refused_run_started_reruns_the_early_body_once(
    make_app: MakeApp, faulty: FaultyWorld, early: list[tuple[str, int]]
) -> None:
    """Seed 003 "When run_started or a later write is refused": the fence refuses turbo's
    run_started after the early body ran. Its outcome is discarded, the delivery is
    redelivered in a second, and the redelivery (delivery count 2: it loads the log, no
    early start) runs the body again. The body ran twice; the log has one start and one
    outcome for it."""
    app = make_app(world=faulty, **TURBO_ONLY)
    ran: Counter[str] = Counter()

    @app.step
    async def work() -> str:
        ran["work"] += 1
        return "w"

    @app.workflow
    async def flow() -> str:
        return await work()

    faulty.events.refuse_in_band(1, when=is_run_started)
    run = await app.start(flow)
    assert await run.result(timeout=30) == "w"
    first, second = faulty.queue.orchestrator_answers()[:2]
    assert first.meta.delivery_count == 1 and first.result == messages.Redeliver(1)
    assert second.meta.delivery_count == 2 and second.result == messages.ACK
    assert ran == Counter(work=2)
    assert early == [("work", 1)]
    kinds = types(await assert_sound(run))
    assert kinds.count("step_started") == 1 and kinds.count("step_completed") == 1
    assert kinds.count("run_started") == 1


async def test_optimistic_inline_start_off_awaits_each_start_and_still_skips_the_load(
    make_app: MakeApp, faulty: FaultyWorld, early: list[tuple[str, int]]
) -> None:
    """Seed 003 "Turbo configuration": ``WORKFLOW_OPTIMISTIC_INLINE_START=0`` keeps
    turbo's skipped load and backgrounded run_started; each inline body waits for its
    start to commit."""
    app = make_app(world=faulty, **TURBO_ONLY, WORKFLOW_OPTIMISTIC_INLINE_START="0")
    loads = _count_loads(faulty)
    own: dict[str, bool] = {}

    @app.step
    async def a() -> str:
        own["a"] = await own_start_in_log(faulty, "a")
        return "a"

    @app.workflow
    async def flow() -> str:
        return await a()

    run = await app.start(flow)
    assert await run.result(timeout=30) == "a"
    assert own == {"a": True} and early == []
    assert 1 not in loads, "the first delivery still skipped the load (turbo)"
    await assert_sound(run)


async def test_turbo_off_loads_awaits_run_started_and_every_start(
    make_app: MakeApp, faulty: FaultyWorld, early: list[tuple[str, int]]
) -> None:
    """``WORKFLOW_TURBO=0``: the first delivery loads the log, and no body starts
    before its start (the optimistic inline start only exists under turbo)."""
    app = make_app(world=faulty, **TURBO_ONLY, WORKFLOW_TURBO="false")
    loads = _count_loads(faulty)
    own: dict[str, bool] = {}

    @app.step
    async def a() -> str:
        own["a"] = await own_start_in_log(faulty, "a")
        return "a"

    @app.workflow
    async def flow() -> str:
        return await a()

    run = await app.start(flow)
    assert await run.result(timeout=30) == "a"
    assert own == {"a": True} and early == []
    assert loads[:1] == [1], "the first delivery loaded the log"
    await assert_sound(run)


async def test_a_coalesced_re_run_of_the_first_delivery_is_not_turbo(
    make_app: MakeApp, faulty: FaultyWorld, early: list[tuple[str, int]]
) -> None:
    """Seed 003 "Coalesced re-run of the first delivery": the start message's first
    delivery (turbo) creates a hook and acks; a wake folded into it re-runs it with
    delivery count 2 and the same run_input. The re-run is held until the hook's
    payload is in, so it runs b: it loads the log and b waits for its start."""
    app = make_app(world=faulty, **TURBO_ONLY, WORKFLOW_ORCHESTRATOR_LINGER_MS=0)
    loads = _count_loads(faulty)
    ran: dict[str, int] = {}
    own: dict[str, bool] = {}

    @app.step
    async def b(n: int) -> int:
        current = CURRENT.get()
        assert current is not None
        ran["b"] = current.meta.rerun
        own["b"] = await own_start_in_log(faulty, "b")
        return n + 1

    @app.workflow
    async def flow() -> int:
        ping = await Ping.wait(token="tb-rerun")
        return await b(ping.n)

    first_held = asyncio.Event()
    rerun_held = asyncio.Event()
    faulty.queue.hold_deliveries(lambda s: getattr(s.message, "run_input", None) is not None
                                 and s.meta.rerun == 0, first_held)  # fmt: skip
    faulty.queue.hold_deliveries(lambda s: s.meta.rerun >= 1, rerun_held)
    run = await app.start(flow)
    await faulty.queue.until(lambda: bool(faulty.queue.started))
    record = await run.get()
    await faulty.queue.send(
        messages.OrchestratorMessage(
            run_id=run.run_id, deployment_id=record.deployment_id, run_spec_version=9
        )
    )
    from .faults import until_coalesced

    await until_coalesced(faulty, run.run_id)
    first_held.set()
    await faulty.queue.until(lambda: any(s.meta.rerun >= 1 for s in faulty.queue.started))
    await app.resume_hook("tb-rerun", Ping(n=1))
    rerun_held.set()
    assert await run.result(timeout=30) == 2
    rerun = next(s for s in faulty.queue.started if s.meta.rerun >= 1)
    assert rerun.meta.delivery_count == 2 and rerun.message.run_input is not None
    assert loads[:1] == [2], "the turbo first delivery loaded nothing; its re-run did"
    assert early == []
    assert own == {"b": True}
    await assert_sound(run)


async def test_a_start_message_copy_after_progress_runs_no_completed_body(
    make_app: MakeApp, faulty: FaultyWorld, early: list[tuple[str, int]]
) -> None:
    """Seed 003 "Rotated start message re-entering turbo": a copy of the start message
    (run_input, delivered with count 1) reaches a run whose first delivery ran a early and
    now waits on a hook. Turbo is taken from the run's record (pending, nothing after its
    creation), never from the message, so the copy loads the log: no early start, no
    body run again, nothing written. The run then completes with a run once.

    Seen to fail: ``turbo_start_from_record`` with its pending check removed: the copy
    replays a synthesized log and starts a's body again before its run_started is refused."""
    app = make_app(world=faulty, **TURBO_ONLY)
    ran: Counter[str] = Counter()

    @app.step
    async def a() -> str:
        ran["a"] += 1
        return "a"

    @app.workflow
    async def flow() -> str:
        got = await a()
        ping = await Ping.wait(token="tb-copy")
        return f"{got}{ping.n}"

    run = await app.start(flow)
    await faulty.queue.until(
        lambda: any(x.result == messages.ACK for x in faulty.queue.orchestrator_answers())
    )
    (start,) = [
        s
        for s in faulty.queue.sent
        if isinstance(s.message, messages.OrchestratorMessage) and s.message.run_input
    ]
    first = faulty.queue.orchestrator_answers()[0].meta.message_id
    for _ in range(5):
        # A copy arriving as the gate frees is folded into a re-run of the first
        # delivery; send again until one is delivered as a message of its own.
        answered = len(faulty.queue.orchestrator_answers())
        await faulty.queue.send(start.message)
        await faulty.queue.until(lambda n=answered: len(faulty.queue.orchestrator_answers()) > n)
        if faulty.queue.orchestrator_answers()[answered].meta.message_id != first:
            break
    copy = faulty.queue.orchestrator_answers()[answered]
    assert copy.meta.delivery_count == 1 and copy.result == messages.ACK
    assert ran == Counter(a=1) and early == [("a", 1)], "only the first delivery started a"
    await app.resume_hook("tb-copy", Ping(n=5))
    assert await run.result(timeout=30) == "a5"
    kinds = types(await assert_sound(run))
    assert kinds.count("run_started") == 1 and kinds.count("step_started") == 1
    assert ran == Counter(a=1)
