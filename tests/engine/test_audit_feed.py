"""Audit rows on what a delivery learns while it holds the run (both Worlds).

RL12 (an event landing after the code decided: another pass), EP15 (a live feed
that fails: logged, the delivery goes on), G2 (a run_cancelled landing below the
delivery's own run_completed wins), RL16 (a background step's start commits
before its body; one completion wake), H1 (an unstamped message for a held
spec 9 run is gated, not run beside the holder).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from treadle import Hook
from treadle.errors import RunCancelledError
from treadle.world import events, messages

from .audit import assert_sound, types
from .conftest import MakeApp
from .faults import CURRENT, FaultyWorld, until_coalesced


class Ping(Hook):
    n: int


async def test_an_event_landing_after_the_code_decided_gets_another_pass(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit RL12 / seed 003 "Event landed after the VM decided": the delivery's code waits
    on a hook; no linger. Just before its closing tail read, hook_received commits (no wake
    is sent). The tail read finds it, the delivery runs another pass and completes the run
    itself; no other orchestrator delivery runs."""
    app = make_app(world=faulty, WORKFLOW_ORCHESTRATOR_LINGER_MS=0)

    @app.workflow
    async def flow() -> str:
        ping = await Ping.wait(token="rl12-ping")
        return f"got {ping.n}"

    inner = faulty.events.list
    landed: list[int] = []

    async def listed(run_id: str, **kw: Any) -> Any:
        current = CURRENT.get()
        if current is not None and kw.get("after_slot") and not landed:
            log = (await inner(run_id)).events
            hooks = [e for e in log if e.type == "hook_created"]
            if hooks:
                landed.append(1)
                await faulty.events.create(
                    run_id,
                    events.HookReceived(correlation_id=hooks[0].correlation_id,
                                        payload={"n": 12}),
                    in_band=False,
                )  # fmt: skip
        return await inner(run_id, **kw)

    faulty.events.list = listed  # type: ignore[method-assign]
    run = await app.start(flow)
    assert await run.result(timeout=10) == "got 12"
    assert landed == [1]
    (answer,) = faulty.queue.orchestrator_answers()
    assert answer.result == messages.ACK and answer.meta.delivery_count == 1
    done = next(t for t in faulty.trace if t.name == "run_completed")
    assert done.by is not None and done.by.meta is answer.meta
    await assert_sound(run)


async def test_a_failing_live_feed_is_logged_and_the_delivery_goes_on(
    make_app: MakeApp, faulty: FaultyWorld, caplog: pytest.LogCaptureFixture
) -> None:
    """Audit EP15 / seed 003 "Feed failure logged, delivery continues": the live feed fails
    while an inline body runs; the delivery logs it (naming the run), keeps going without
    the feed, and completes the run in that same delivery."""
    app = make_app(world=faulty)
    inner = faulty.events.subscribe

    def failing(run_id: str, after: int, on_event: Any, on_error: Any) -> Any:
        sub = inner(run_id, after, lambda e: None, lambda exc: None)  # never pushes
        asyncio.get_running_loop().call_later(
            0.1, on_error, ConnectionError("injected: the feed dropped")
        )
        return sub

    faulty.events.subscribe = failing  # type: ignore[method-assign]

    @app.step
    async def slow() -> str:
        await asyncio.sleep(0.5)
        return "slow"

    @app.workflow
    async def flow() -> str:
        return await slow()

    caplog.set_level(logging.INFO, logger="treadle.orchestrator")
    run = await app.start(flow)
    assert await run.result(timeout=10) == "slow"
    feed = [r for r in caplog.records if "live feed error" in r.getMessage()]
    assert feed and run.run_id in feed[0].getMessage()
    (answer,) = faulty.queue.orchestrator_answers()
    assert answer.result == messages.ACK
    await assert_sound(run)


async def test_a_cancel_landing_below_the_own_run_completed_wins(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit G2 (terminal part) / seed 003 "Out-of-band event below an own write": a
    run_cancelled commits just before the delivery's run_completed; that write is refused
    (RunExpired), the delivery acks, the run is cancelled with one terminal event."""
    app = make_app(world=faulty)

    @app.workflow
    async def flow() -> str:
        return "done"

    inner = faulty.events.create
    cut: list[int] = []

    async def created(run_id: str, event: events.Event, **kw: Any) -> Any:
        if event.type == "run_completed" and not cut:
            cut.append(1)
            await inner(run_id, events.RunCancelled(reason="raced"), in_band=False)
        return await inner(run_id, event, **kw)

    faulty.events.create = created  # type: ignore[method-assign]
    run = await app.start(flow)
    with pytest.raises(RunCancelledError):
        await run.result(timeout=10)
    await faulty.queue.until(lambda: bool(faulty.queue.orchestrator_answers()))
    assert faulty.queue.orchestrator_answers()[0].result == messages.ACK
    kinds = types(await assert_sound(run))
    assert kinds[-1] == "run_cancelled" and "run_completed" not in kinds


async def test_a_background_steps_start_commits_before_its_body_and_it_wakes_once(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit RL16 / seed 003 "Background step after its body": the step's step_started is
    in the log when its body runs; after the outcome the step delivery sends exactly one
    completion wake."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=0)
    seen: list[list[str]] = []

    @app.step
    async def work() -> str:
        current = CURRENT.get()
        assert current is not None
        page = await faulty.events.list(current.message.run_id)
        seen.append([e.type for e in page.events])
        return "w"

    @app.workflow
    async def flow() -> str:
        return await work()

    run = await app.start(flow)
    assert await run.result(timeout=10) == "w"
    assert seen and seen[0][-1] == "step_started", seen
    # The run can end (its orchestrator saw the outcome on its feed) before the step
    # delivery's own answer is recorded: wait for that answer.
    await faulty.queue.until(lambda: any(a.kind == "step" for a in faulty.queue.answers))
    step = next(a for a in faulty.queue.answers if a.kind == "step")
    wakes = [t for t in faulty.trace if t.what == "send" and t.by is not None
             and t.by.meta is step.meta]  # fmt: skip
    assert len(wakes) == 1 and wakes[0].name == "orchestrator"


async def test_an_unstamped_message_for_a_held_run_is_gated_not_run_beside_it(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit H1 / seed 003 "Unstamped message for a spec 9 run": while a delivery holds the
    run, a message naming the run but stamped with no spec version or deployment arrives;
    it is coalesced into the holder (gated by run id), never delivered beside it."""
    app = make_app(world=faulty, WORKFLOW_ORCHESTRATOR_LINGER_MS=0)

    @app.workflow
    async def flow() -> str:
        ping = await Ping.wait(token="h1-ping")
        return f"got {ping.n}"

    release = asyncio.Event()
    faulty.queue.hold_deliveries(lambda s: getattr(s.message, "run_input", None) is not None,
                                 release)  # fmt: skip
    run = await app.start(flow)
    await faulty.queue.until(lambda: bool(faulty.queue.started))
    await faulty.queue.send(messages.OrchestratorMessage(run_id=run.run_id))
    # The queue folds it into the holder (its own count says so): it cannot run beside it.
    await until_coalesced(faulty, run.run_id)
    assert len(faulty.queue.started) == 1, "the unstamped message ran beside the holder"
    release.set()
    await faulty.queue.until(lambda: any(a.meta.rerun >= 1
                                         for a in faulty.queue.orchestrator_answers()))  # fmt: skip
    await app.resume_hook("h1-ping", Ping(n=1))
    assert await run.result(timeout=10) == "got 1"
