"""Edge cases about open work a dead or stalled delivery left, divergence and deadlines."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from pathlib import Path

import pytest

from treadle import Hook, sleep
from treadle.errors import RunFailedError
from treadle.replay import operations
from treadle.world import contract, events, messages
from treadle.worlds.local import LocalWorld

from .conftest import MakeApp
from .faults import FaultyWorld


async def _dead_delivery_left_inline_step(
    world: LocalWorld, workflow: str, step: str, max_retries: int
) -> str:
    """A run whose first delivery started an inline step and died inside its body."""
    run = await world.runs.create(
        workflow_name=workflow, input={"args": [], "kwargs": {}}, deployment_id="local",
        spec_version=9,
    )  # fmt: skip
    cid = operations.correlation_id("step", run.run_id, 0)
    await world.events.create(
        run.run_id, events.RunStarted(), in_band=True, expected_seq_in_band=1, event_count=1
    )
    await world.events.create(
        run.run_id,
        events.StepStarted(correlation_id=cid, step_name=step, attempt=1, inline=True,
                           input={"args": [], "kwargs": {}}, position=0, max_retries=max_retries),
        in_band=True, expected_seq_in_band=2, event_count=2,
    )  # fmt: skip
    return run.run_id


@pytest.mark.parametrize(("max_retries", "body_runs", "outcome"), [(0, 0, "failed"), (3, 1, "ok")])
async def test_inline_step_after_an_orchestrator_crash(
    tmp_path: Path, make_app: MakeApp, max_retries: int, body_runs: int, outcome: str
) -> None:
    """E1: a start committed, the delivery died in the body. The redelivery finds one start
    and no outcome: max_retries=0 fails the step without the body (it ran once already);
    max_retries=3 runs it again as attempt 2."""
    world = await LocalWorld(tmp_path / "world").open()
    app = make_app(world=world)
    ran: Counter[int] = Counter()

    @app.step(max_retries=max_retries)
    async def charge() -> str:
        from treadle import step_metadata

        ran[step_metadata().attempt] += 1
        return "ok"

    @app.workflow
    async def pay() -> str:
        try:
            return await charge()
        except Exception:
            return "failed"

    run_id = await _dead_delivery_left_inline_step(world, "pay", "charge", max_retries)
    await world.queue.send(messages.OrchestratorMessage(run_id=run_id, run_spec_version=9))
    await app.world()
    assert await app.get_run(run_id).result(timeout=10) == outcome
    assert sum(ran.values()) == body_runs
    if body_runs:
        assert ran == Counter({2: 1})


async def test_replay_divergence_recovered_in_place(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    """Audit G1, once: the third replay diverges at position 2 (the log has step b, the code
    reaches step c), is logged once, replays cold in place (a fourth replay) and completes.
    Warm sessions off: the divergence is made by code that changes between replays from
    the start, which a warm continuation (docs/warm.md) does not run again."""
    app = make_app(TREADLE_WARM_RUNS=0)
    caplog.set_level(logging.WARNING, logger="treadle.orchestrator")
    replays: list[int] = []

    @app.step
    async def a() -> str:
        return "a"

    @app.step
    async def b() -> str:
        return "b"

    @app.step
    async def c() -> str:
        return "c"

    @app.workflow
    async def flow() -> str:
        replays.append(1)
        first = await a()
        await sleep(0.05)
        second = await (c() if len(replays) == 3 else b())
        await sleep(0.05)
        return first + second

    run = await app.start(flow)
    assert await run.result(timeout=10) == "ab"
    diverged = [r for r in caplog.records if "replay diverged" in r.getMessage()]
    assert len(diverged) == 1, "the divergence under test happened, once"
    assert "position 2" in diverged[0].getMessage() and run.run_id in diverged[0].getMessage()
    assert len(replays) == 4, "three replays, the third diverged, one cold replay after it"


async def test_replay_divergence_past_the_budget_is_a_corrupted_log(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    """Audit G1, always: after WORKFLOW_REPLAY_DIVERGENCE_MAX_RETRIES (2 here) cold replays
    the run fails with CorruptedEventLog naming the position and the mismatch."""
    # Cold replays, and no linger: the gate's payload must wake a new delivery, which
    # replays cold, rather than resume the lingering one's live run.
    app = make_app(WORKFLOW_REPLAY_DIVERGENCE_MAX_RETRIES=2, TREADLE_WARM_RUNS=0,
                   WORKFLOW_ORCHESTRATOR_LINGER_MS=0)  # fmt: skip
    caplog.set_level(logging.WARNING, logger="treadle.orchestrator")
    # The code changes when the test says so, once the run waits at its gate hook (so step
    # b is recorded), not after some number of passes: a loaded machine coalesces short
    # sleeps into fewer passes (CI saw this test finish in two and never diverge). The
    # replay that diverges is the one the gate's payload wakes.
    changed: list[bool] = []
    replays: list[bool] = []

    @app.step
    async def a() -> str:
        return "a"

    @app.step
    async def b() -> str:
        return "b"

    @app.step
    async def c() -> str:
        return "c"

    @app.workflow
    async def flow() -> str:
        replays.append(bool(changed))
        first = await a()
        await sleep(0.05)
        second = await (c() if changed else b())
        await Payload.wait(token="diverge-gate")
        return first + second

    run = await app.start(flow)
    deadline = time.monotonic() + 10
    while "hook_created" not in [e.type for e in await run.events()]:
        assert time.monotonic() < deadline, "the run never reached its gate hook"
        await asyncio.sleep(0.01)
    changed.append(True)
    await app.resume_hook("diverge-gate", {"value": "go"})
    with pytest.raises(RunFailedError, match=r"position 2.*step b.*step c"):
        await run.result(timeout=10)
    error = (await run.get()).error
    assert error is not None and error.type == "CorruptedEventLog"
    diverged = [r for r in caplog.records if "replay diverged" in r.getMessage()]
    assert len(diverged) == 3, "the first divergence and two cold replays, then the failure"
    assert replays.count(True) == 1 + 2, "the replay that diverged, then two cold replays"


class Payload(Hook):
    value: str


async def test_a_hook_payload_landing_while_an_inline_step_runs(make_app: MakeApp) -> None:
    """G2 / "a hook payload lands while an inline step runs": race(hook, step) settles to
    the hook, whose event sits first in the log, live and on every replay after."""
    app = make_app()
    step_started = asyncio.Event()
    release = asyncio.Event()

    @app.step
    async def slow() -> str:
        step_started.set()
        await release.wait()
        return "step"

    @app.workflow
    async def race() -> str:
        hook = Payload.wait(token="race-hook")
        step = slow()
        done, _ = await asyncio.wait(
            [asyncio.ensure_future(hook), asyncio.ensure_future(step)],
            return_when=asyncio.FIRST_COMPLETED,
        )
        winner = done.pop().result()
        await sleep(0.05)  # one more delivery, replaying the race cold
        return winner if isinstance(winner, str) else f"hook:{winner.value}"

    run = await app.start(race)
    await asyncio.wait_for(step_started.wait(), 10)
    await app.resume_hook("race-hook", {"value": "first"})
    world = await app.world()
    deadline = time.monotonic() + 10
    while "hook_received" not in [e.type for e in await run.events()]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    release.set()
    del world
    assert await run.result(timeout=10) == "hook:first"
    log = await run.events()
    types = [e.type for e in log]
    assert types.index("hook_received") < types.index("step_completed")


async def test_inline_window_hands_off_and_the_margin_sends_steps_to_the_background(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """F4 / "Deadline handoff and the inline-start margin": a body running past the window
    ends the delivery with Handoff (attempt unchanged); steps in the margin go background."""
    app = make_app(world=faulty, WORKFLOW_V2_TIMEOUT_MS=1000,
                   WORKFLOW_INLINE_STEP_DEADLINE_MARGIN_MS=600)  # fmt: skip

    @app.step
    async def nap(seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    @app.workflow
    async def flow() -> float:
        total = await nap(1.1)  # inline, runs past the window
        for _ in range(3):
            total += await nap(0.01)
        return total

    run = await app.start(flow)
    assert await run.result(timeout=20) == pytest.approx(1.13)
    answers = faulty.queue.orchestrator_answers()
    assert answers[0].result == messages.HANDOFF
    after = answers[1].meta
    assert after.message_id == answers[0].meta.message_id
    assert (after.delivery_count, after.attempt) == (2, 1)
    starts = [e.event for e in await run.events() if e.type in ("step_started", "step_created")]
    assert starts[0].inline


async def test_a_message_for_another_deployment_is_rerouted_then_fails(
    tmp_path: Path, make_app: MakeApp
) -> None:
    """H5: a delivery for a run pinned to another deployment is not replayed; it is re-sent
    after 1, 2, 4 s and then the run fails with DeploymentMismatch."""
    world = await LocalWorld(
        tmp_path / "world", tuning=contract.QueueTuning(lease_seconds=5)
    ).open()
    app = make_app(world=world, TREADLE_DEPLOYMENT_ID="green")
    replayed: list[int] = []

    @app.workflow
    async def flow() -> str:
        replayed.append(1)
        return "ran"

    await world.deployments.register("blue")  # live, but no worker of it here
    run = await world.runs.create(
        workflow_name="flow", input={"args": [], "kwargs": {}}, deployment_id="blue",
        spec_version=9,
    )  # fmt: skip
    await world.queue.send(
        messages.OrchestratorMessage(run_id=run.run_id, deployment_id="blue", run_spec_version=9)
    )
    started = time.monotonic()
    await app.world()
    with pytest.raises(RunFailedError, match="DeploymentMismatch"):
        await app.get_run(run.run_id).result(timeout=20)
    assert time.monotonic() - started >= 7 - 0.1
    assert replayed == []
