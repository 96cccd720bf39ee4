"""Whole runs on the production World: the engine over Postgres + NATS JetStream."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from treadle import Hook, RetryableError, Workflows, settings, sleep, step_metadata
from treadle.errors import HookNotFound
from treadle.world import contract

from .conftest import ProductionHarness

TUNING = contract.QueueTuning(lease_seconds=5.0, backoff_base_seconds=0.05, backoff_max_seconds=0.5)
FAST = {
    "WORKFLOW_ORCHESTRATOR_LINGER_MS": 500,
    "WORKFLOW_STEP_RETRY_DELAY_SECONDS": 0.05,
    "TREADLE_DEPLOYMENT_ID": "prod",
}


@pytest.fixture
async def app(harness: ProductionHarness) -> AsyncIterator[Workflows]:
    world = await harness.open(TUNING)
    application = Workflows(world=world, settings_=settings.load({}, **FAST), worker=True)
    yield application
    await application.close(grace_seconds=2)
    await world.close()


class Approval(Hook):
    approved: bool


async def test_steps_a_sleep_and_a_fan_out(app: Workflows) -> None:
    """Inline and background steps, a durable sleep (a JetStream schedule), one run."""
    ran: Counter[int] = Counter()

    @app.step
    async def work(i: int) -> int:
        ran[i] += 1
        return i

    @app.workflow
    async def flow(n: int) -> int:
        first = await work(-1)
        await sleep(1.0)
        return first + sum(await asyncio.gather(*(work(i) for i in range(n))))

    started = time.monotonic()
    run = await app.start(flow, 20)
    assert await run.result(timeout=30) == sum(range(20)) - 1
    assert time.monotonic() - started >= 1.0
    assert ran == Counter({i: 1 for i in range(-1, 20)})
    log = await run.events()
    assert len([e for e in log if e.type == "step_created"]) == 17


async def test_an_inline_retry_moves_to_its_own_message(app: Workflows) -> None:
    """E3 on NATS: the retry is a delayed JetStream message for the step."""
    attempts: list[int] = []

    @app.step
    async def flaky() -> str:
        attempts.append(step_metadata().attempt)
        if len(attempts) == 1:
            raise RetryableError("busy", retry_after=0.2)
        return "ok"

    @app.workflow
    async def flow() -> str:
        return await flaky()

    run = await app.start(flow)
    assert await run.result(timeout=30) == "ok"
    assert attempts == [1, 2]


async def test_a_hook_resumed_from_outside(app: Workflows) -> None:
    """resume_hook writes out-of-band and wakes the run through NATS."""

    @app.workflow
    async def flow() -> str:
        answer = await Approval.wait(token="prod-approval")
        return f"approved={answer.approved if answer else None}"

    run = await app.start(flow)
    world = await app.world()
    deadline = time.monotonic() + 15
    while True:
        try:
            await world.hooks.get_by_token("prod-approval")
            break
        except HookNotFound:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
    await app.resume_hook("prod-approval", {"approved": True})
    assert await run.result(timeout=30) == "approved=True"
