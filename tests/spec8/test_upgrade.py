"""Seed 003 "A spec 8 run after an upgrade" (issue 12 item 5), on the local World and on
Postgres + NATS: a run created as spec 8 keeps spec 8 after the app upgrades and sets
``WORKFLOW_SPEC_VERSION=9``, across a 7-day sleep; a new run of the same workflow is
spec 9; both give the same result.
"""

from __future__ import annotations

import asyncio
from typing import Any

from treadle import Workflows, settings, sleep
from treadle.world import events, messages

from ..engine.conftest import FAST, OpenWorld
from ..engine.faults import FaultyWorld


def _approval_app(world: Any, spec_version: int, calls: list[str]) -> Workflows:
    """The seed's ``approval`` workflow (step, a 7-day sleep, step) on an app minting
    ``spec_version``, serving its runs in this process."""
    app = Workflows(
        world=world,
        settings_=settings.load({}, **{**FAST, "WORKFLOW_SPEC_VERSION": spec_version}),
        worker=True,
    )

    @app.step
    async def notify_approver(request_id: str) -> str:
        calls.append(f"notify {request_id}")
        return f"notified {request_id}"

    @app.step
    async def escalate(request_id: str) -> str:
        calls.append(f"escalate {request_id}")
        return f"escalated {request_id}"

    @app.workflow
    async def approval(request_id: str) -> str:
        await notify_approver(request_id)
        await sleep("7d")
        return await escalate(request_id)

    return app


async def _until_sleeping(run: Any, faulty: FaultyWorld) -> events.LoggedEvent:
    """The run's ``wait_created``, once it is in the log and its timer was sent."""

    def timer_sent() -> bool:
        return any(t.message.run_id == run.run_id for t in faulty.queue.timers())

    await faulty.queue.until(timer_sent)
    async with asyncio.timeout(10):
        while not (waits := [e for e in await run.events() if e.type == "wait_created"]):  # noqa: ASYNC110
            await asyncio.sleep(0.02)  # the log of another task's delivery: polled
    (wait,) = waits
    return wait


async def test_a_spec_8_run_keeps_spec_8_across_an_upgrade_to_spec_9(
    open_world: OpenWorld,
) -> None:
    """Seed 003 "A spec 8 run after an upgrade": ``approval`` is started by an app with
    WORKFLOW_SPEC_VERSION=8 and reaches its 7-day sleep (a timer stamped 8 is queued).
    That app's worker stops; the upgraded app (WORKFLOW_SPEC_VERSION=9) serves the World.
    The sleep is brought due without waiting 7 days through ``run.wake_up()`` (as the
    engine suites end long sleeps; on a spec 8 run it writes ``wait_completed``
    out-of-band and sends a wake stamped with the run's version): the upgraded worker
    routes the run to the spec 8 orchestrator, which finishes it as spec 8 (out-of-band
    writes only after the World's ``run_created``, no ``wake_requested``, spec_version 8
    on the run). A new run of the same
    workflow from the upgraded app is spec 9 (its wake-up is the spec 9
    ``wake_requested``), and both runs give the same result."""
    calls: list[str] = []
    world_8 = FaultyWorld(await open_world())
    before = _approval_app(world_8, 8, calls)
    try:
        old = await before.start("approval", "req-1")
        wait = await _until_sleeping(old, world_8)
        (timer, *_) = world_8.queue.timers(wait.correlation_id)
        assert isinstance(timer.message, messages.OrchestratorMessage)
        assert timer.message.run_spec_version == 8
        assert timer.delay_seconds > 3600, "the 7-day sleep's timer is a long (hop) delay"
        assert (await old.get()).spec_version == 8
    finally:
        await before.close(grace_seconds=2)
        await world_8.close()

    world_9 = FaultyWorld(await open_world())
    after = _approval_app(world_9, 9, calls)
    try:
        old = after.get_run(old.run_id)
        assert await old.status() == "running"
        assert await old.wake_up() == 1
        assert await old.result(timeout=20) == "escalated req-1"
        record = await old.get()
        assert record.spec_version == 8, "a run never changes format"
        log = await old.events()
        types = [e.type for e in log]
        assert "wake_requested" not in types, "a spec 8 run is never given a spec 9 event"
        # Slot 1, run_created, is written by runs.create (the World's, for every run).
        assert log[0].type == "run_created"
        in_band = [e.type for e in log[1:] if e.in_band]
        assert in_band == [], f"spec 8 writes are out-of-band, not {in_band}"
        assert types.count("wait_completed") == 1
        assert types[-1] == "run_completed"
        served = [s for s in world_9.queue.started if s.message.run_id == old.run_id]
        assert served, "the upgraded worker served the spec 8 run"

        new = await after.start("approval", "req-1")
        await _until_sleeping(new, world_9)
        assert (await new.get()).spec_version == 9
        assert await new.wake_up() == 1
        assert await new.result(timeout=20) == "escalated req-1"
        new_log = await new.events()
        assert "wake_requested" in [e.type for e in new_log]
        assert [e for e in new_log[1:] if e.in_band], "spec 9 writes are in-band"
    finally:
        await after.close(grace_seconds=2)
        await world_9.close()
    assert calls == ["notify req-1", "escalate req-1"] * 2
