"""Audit rows on a run's lifecycle across deliveries (both Worlds).

Turbo and the start message (G5, FE2, RT9), a hook resumed while a delivery
lingers (D1) and when a delivery must not linger (RL13, HE5), a cancel landing
while a delivery runs (RL15), and a run of a format this worker lacks (H5).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from treadle import Hook, sleep
from treadle.errors import RunCancelledError
from treadle.world import events, messages

from .audit import assert_sound, cold_outcome, types
from .conftest import MakeApp
from .faults import CURRENT, FaultyWorld


class Ping(Hook):
    n: int


def _count_loads(world: FaultyWorld) -> list[int]:
    """Record, per full log load (``events.list`` from slot 0), the delivery count."""
    loads: list[int] = []
    inner = world.events.list

    async def listed(run_id: str, **kw: Any) -> Any:
        current = CURRENT.get()
        if current is not None and current.kind == "orchestrator" and not kw.get("after_slot"):
            loads.append(current.meta.delivery_count)
        return await inner(run_id, **kw)

    world.events.list = listed  # type: ignore[method-assign]
    return loads


async def test_a_refused_turbo_run_started_redelivers_and_the_redelivery_loads_the_log(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit FE2, RT9 and G5 / seed 003 "A failed turbo run_started decides the delivery":
    the start message's first delivery goes turbo (no log load) and its run_started is
    refused by the fence: it answers Redeliver(1). The redelivery is not turbo: it loads
    the log, then writes run_started and completes."""
    app = make_app(world=faulty)
    loads = _count_loads(faulty)

    @app.workflow
    async def flow() -> str:
        return "done"

    faulty.events.refuse_in_band(1, when=lambda e: e.type == "run_started")
    run = await app.start(flow)
    assert await run.result(timeout=20) == "done"
    first, second = faulty.queue.orchestrator_answers()[:2]
    assert first.meta.delivery_count == 1 and first.result == messages.Redeliver(1)
    assert second.meta.delivery_count == 2 and second.result == messages.ACK
    assert 1 not in loads, "the first delivery went turbo: no load"
    assert 2 in loads, "the redelivery loaded the log"
    assert types(await assert_sound(run)).count("run_started") == 1


async def test_a_run_cancelled_before_its_turbo_start_acks_and_writes_nothing(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit RT9 and RL2 (ended run) / seed 003 "Run already finished at setup": the run is
    cancelled while its start message waits; the turbo delivery's run_started is refused
    (RunExpired), so it acks; the log is run_created, run_cancelled; no body ran."""
    app = make_app(world=faulty)
    ran: list[str] = []

    @app.step
    async def work() -> str:
        ran.append("work")
        return "w"

    @app.workflow
    async def flow() -> str:
        return await work()

    release = asyncio.Event()
    faulty.queue.hold_deliveries(lambda s: getattr(s.message, "run_input", None) is not None,
                                 release)  # fmt: skip
    run = await app.start(flow)
    await faulty.queue.until(lambda: bool(faulty.queue.started))
    await run.cancel()
    release.set()
    await faulty.queue.until(lambda: bool(faulty.queue.orchestrator_answers()))
    assert faulty.queue.orchestrator_answers()[0].result == messages.ACK
    with pytest.raises(RunCancelledError):
        await run.result(timeout=5)
    assert types(await assert_sound(run)) == ["run_created", "run_cancelled"]
    assert ran == []


async def test_a_hook_resumed_while_the_delivery_lingers_is_acted_on_once_via_the_feed(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit D1 / seed 003 "Resume while the orchestrator runs": the first delivery lingers
    on its open hook; resume_hook commits hook_received and sends a wake. The lingering
    delivery acts on it through the live feed (no second replay of the workflow); the wake
    coalesces into it or acks after a tail read, writing nothing."""
    app = make_app(world=faulty, WORKFLOW_ORCHESTRATOR_LINGER_MS=8000)
    replays: list[int] = []

    @app.workflow
    async def flow() -> str:
        replays.append(1)
        ping = await Ping.wait(token="d1-ping")
        return f"got {ping.n}"

    run = await app.start(flow)
    await faulty.queue.until(lambda: any(t.name == "hook_created" for t in faulty.trace))
    assert faulty.queue.orchestrator_answers() == [], "the first delivery lingers"
    await app.resume_hook("d1-ping", Ping(n=1))
    assert await run.result(timeout=10) == "got 1"
    assert replays == [1], "acted on once, in the lingering delivery's replay"
    done = next(t for t in faulty.trace if t.name == "run_completed")
    assert done.by is not None and done.by.meta.delivery_count == 1 and done.by.meta.rerun == 0
    await faulty.queue.until(lambda: len(faulty.queue.orchestrator_answers()) >= 1)
    writers = {id(t.by.meta) for t in faulty.trace if t.by is not None and t.what == "write"}
    others = [a for a in faulty.queue.orchestrator_answers() if a.meta is not done.by.meta]
    assert all(a.result == messages.ACK and id(a.meta) not in writers for a in others)
    log = await assert_sound(run)
    assert types(log).count("hook_received") == 1


@pytest.mark.parametrize("case", ["sleep-alone", "inside-the-margin"])
async def test_a_delivery_does_not_linger_for_a_sleep_alone_or_inside_the_margin(
    make_app: MakeApp, faulty: FaultyWorld, case: str
) -> None:
    """Audit RL13 and HE5 / seed 003 "Linger", "No linger when deadline minus margin is 0":
    with an 8 s linger, a delivery waiting on a sleep alone, or on a hook when its window
    (1 s) is inside the margin (2 s), answers Ack at once instead of lingering."""
    overrides: dict[str, Any] = {"WORKFLOW_ORCHESTRATOR_LINGER_MS": 8000}
    if case == "inside-the-margin":
        overrides |= {
            "WORKFLOW_V2_TIMEOUT_MS": 1000,
            "WORKFLOW_INLINE_STEP_DEADLINE_MARGIN_MS": 2000,
        }
    app = make_app(world=faulty, **overrides)

    @app.workflow
    async def flow() -> str:
        if case == "sleep-alone":
            await sleep(30)
        else:
            await Ping.wait(token="he5-ping")
        return "never"

    run = await app.start(flow)
    await faulty.queue.until(lambda: bool(faulty.queue.orchestrator_answers()), timeout=4)
    assert faulty.queue.orchestrator_answers()[0].result == messages.ACK
    await run.cancel()


async def test_a_cancel_landing_while_an_inline_body_runs_ends_the_delivery(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit RL15 / seed 003 "Out-of-band terminal first": the run is cancelled while an
    inline body runs; the delivery lets the body settle, its outcome is still recorded
    (outcomes are accepted after the end), nothing else is written after run_cancelled,
    the delivery acks, and a cold replay of the log comes to the same end."""
    app = make_app(world=faulty)
    entered = asyncio.Event()
    leave = asyncio.Event()

    @app.step
    async def long() -> str:
        entered.set()
        await leave.wait()
        return "long"

    @app.step
    async def after() -> str:
        return "after"

    @app.workflow
    async def flow() -> str:
        got = await long()
        return got + await after()

    run = await app.start(flow)
    await asyncio.wait_for(entered.wait(), 10)
    await run.cancel()
    leave.set()
    with pytest.raises(RunCancelledError):
        await run.result(timeout=10)
    await faulty.queue.until(lambda: bool(faulty.queue.orchestrator_answers()))
    assert faulty.queue.orchestrator_answers()[0].result == messages.ACK
    log = await assert_sound(run)
    kinds = types(log)
    cut = kinds.index("run_cancelled")
    assert set(kinds[cut + 1 :]) <= {"step_completed"}, kinds
    assert "after" not in [
        e.event.step_name
        for e in log
        if isinstance(e.event, events.StepCreated | events.StepStarted)
    ]
    assert cold_outcome(flow, log)[0] != "completed", "a cold replay also stops at the cancel"


async def test_a_run_of_an_unknown_format_is_left_untouched(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit H5 / seed 003 "Wrong process or revision": a run stamped with a spec version
    this worker lacks is answered Redeliver(900) (left for a worker that has it): not
    replayed, nothing written."""
    app = make_app(world=faulty)

    @app.workflow
    async def flow() -> str:
        return "ran"

    record = await faulty.runs.create(
        workflow_name="flow", input={"args": [], "kwargs": {}}, deployment_id="local",
        spec_version=7,
    )  # fmt: skip
    await app.world()
    await faulty.queue.send(
        messages.OrchestratorMessage(run_id=record.run_id, deployment_id="local",
                                     run_spec_version=7)
    )  # fmt: skip
    await faulty.queue.until(lambda: bool(faulty.queue.orchestrator_answers()))
    (answer,) = faulty.queue.orchestrator_answers()
    assert isinstance(answer.result, messages.Redeliver) and answer.result.seconds >= 900
    after = await faulty.runs.get(record.run_id)
    assert after.status == "pending" and after.seq == 1
    assert not [t for t in faulty.trace if t.what == "write"]


async def test_a_coalesced_re_run_of_the_turbo_first_delivery_loads_the_log(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit RT13 and RL4 / seed 003 "Coalesced re-run of the first delivery loads the log":
    a wake is coalesced into the start message's first delivery, which went turbo (no
    load). Its re-run is counted above 1 with the same attempt and invocation start, and
    loads the log instead of synthesizing it."""
    app = make_app(world=faulty, WORKFLOW_ORCHESTRATOR_LINGER_MS=0)
    loads = _count_loads(faulty)

    @app.workflow
    async def flow() -> str:
        ping = await Ping.wait(token="rt13-ping")
        return f"got {ping.n}"

    release = asyncio.Event()
    faulty.queue.hold_deliveries(lambda s: getattr(s.message, "run_input", None) is not None,
                                 release)  # fmt: skip
    run = await app.start(flow)
    await faulty.queue.until(lambda: bool(faulty.queue.started))
    record = await run.get()
    await faulty.queue.send(
        messages.OrchestratorMessage(
            run_id=run.run_id, deployment_id=record.deployment_id, run_spec_version=9
        )
    )
    await asyncio.sleep(0.3)  # the queue folds the wake into the held delivery
    release.set()
    await faulty.queue.until(
        lambda: any(a.meta.rerun >= 1 for a in faulty.queue.orchestrator_answers())
    )
    first, rerun = faulty.queue.orchestrator_answers()[:2]
    assert first.meta.rerun == 0 and rerun.meta.rerun == 1
    assert rerun.meta.delivery_count == 2 and rerun.meta.attempt == first.meta.attempt == 1
    assert rerun.meta.invocation_started_at == first.meta.invocation_started_at
    assert loads[:1] == [2], "the turbo first run loaded nothing; its re-run loaded the log"
    await app.resume_hook("rt13-ping", Ping(n=13))
    assert await run.result(timeout=10) == "got 13"
