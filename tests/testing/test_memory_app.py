"""A real treadle app running end to end on the in-memory World (issue 10, item 1).

``Workflows(world=MemoryWorld(), ...)``: an inline step, background steps (a
fan-out past WORKFLOW_MAX_INLINE_STEPS), a sleep and a hook, to completion; the
log the run leaves passes ``treadle.world.logcheck``.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from treadle import Hook, Workflows, settings, sleep
from treadle.testing.memory import MemoryBackend, MemoryWorld
from treadle.world import contract, events, logcheck

FAST = {
    "WORKFLOW_ORCHESTRATOR_LINGER_MS": 300,
    "WORKFLOW_ORCHESTRATOR_POLL_INTERVAL_MS": 200,
    "WORKFLOW_STEP_RETRY_DELAY_SECONDS": 0.05,
}
TUNING = contract.QueueTuning(lease_seconds=5.0, backoff_base_seconds=0.05, backoff_max_seconds=0.5)


class Approval(Hook):
    approved: bool


async def _hook_created(world: MemoryWorld, run_id: str, token: str) -> None:
    """Wait on the live feed until the run's log holds hook_created for ``token``."""
    seen = asyncio.Event()

    def on_event(logged: events.LoggedEvent) -> None:
        if isinstance(logged.event, events.HookCreated) and logged.event.token == token:
            seen.set()

    sub = world.events.subscribe(run_id, 0, on_event, lambda exc: None)
    try:
        await asyncio.wait_for(seen.wait(), 10)
    finally:
        sub.close()


async def test_an_app_runs_inline_and_background_steps_a_sleep_and_a_hook_to_completion() -> None:
    """Three steps inline, the other 37 from their messages, a sleep, a hook: the run ends."""
    backend = MemoryBackend(tuning=TUNING)
    world = MemoryWorld(backend)
    app = Workflows(world=world, worker=True, settings_=settings.load({}, **FAST))
    ran: Counter[int] = Counter()

    @app.step
    async def work(i: int) -> int:
        ran[i] += 1
        return i

    @app.workflow
    async def flow(n: int) -> str:
        first = await work(100)
        total = sum(await asyncio.gather(*(work(i) for i in range(n))))
        await sleep(0.2)
        answer = await Approval.wait(token="approve:memory")
        assert answer is not None
        return f"{first} {total} approved={answer.approved}"

    try:
        run = await app.start(flow, 40)
        await _hook_created(world, run.run_id, "approve:memory")
        await app.resume_hook("approve:memory", {"approved": True})
        assert await run.result(timeout=20) == f"100 {sum(range(40))} approved=True"
    finally:
        await app.close(grace_seconds=2)
        await world.close()
    assert ran == Counter({100: 1, **{i: 1 for i in range(40)}})
    log = backend.events_of(run.run_id)
    types = [e.type for e in log]
    inline = [e for e in log if isinstance(e.event, events.StepStarted) and e.event.inline]
    created = [e for e in log if e.type == "step_created"]
    assert len(inline) == 1 + 3
    assert len(created) == 37
    assert {"wait_created", "wait_completed", "hook_created", "hook_received"} <= set(types)
    assert types[-1] == "run_completed"
    assert logcheck.problems(backend.run_record(run.run_id), log) == []
    assert backend.queued() == 0
    assert backend.stats.of(run.run_id).deliveries >= 38


async def test_treadle_world_memory_opens_an_in_memory_world_and_serves_its_runs() -> None:
    """TREADLE_WORLD=memory: the app opens a MemoryWorld and runs a worker in process."""
    app = Workflows(world="memory", settings_=settings.load({}, **FAST))

    @app.step
    async def double(n: int) -> int:
        return n * 2

    @app.workflow
    async def flow(n: int) -> int:
        return await double(n)

    try:
        run = await app.start(flow, 21)
        assert isinstance(await app.world(), MemoryWorld)
        assert await run.result(timeout=10) == 42
    finally:
        await app.close(grace_seconds=2)
