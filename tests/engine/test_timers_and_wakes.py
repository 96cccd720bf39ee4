"""The no-op wake and unknown run formats.

Long sleeps in hops and a cancel under a pending hop (audit C7) are in
``test_audit_timers.py``, on both Worlds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from treadle import sleep
from treadle.world import messages
from treadle.worlds.local import LocalWorld

from .conftest import TUNING, MakeApp
from .faults import FaultyWorld


async def _faulty(tmp_path: Path) -> FaultyWorld:
    return FaultyWorld(await LocalWorld(tmp_path / "world", tuning=TUNING).open())


async def test_a_wake_with_nothing_new_acks_without_a_replay(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit RL3 and HE4 / seed 003 "Wake with nothing new": three plain wakes come for a
    run whose log ends where this process left it. Each is delivered, acks after one tail
    read, replays nothing and writes nothing."""
    app = make_app(world=faulty)
    replays: list[int] = []

    @app.workflow
    async def flow() -> str:
        replays.append(1)
        await sleep("1h")
        return "never"

    run = await app.start(flow)
    await faulty.queue.until(lambda: bool(faulty.queue.orchestrator_answers()))
    before = len(replays)
    assert before >= 1
    record = await run.get()
    wakes = [
        messages.OrchestratorMessage(run_id=run.run_id, run_spec_version=record.spec_version)
        for _ in range(3)
    ]
    answered = len(faulty.queue.answers)
    for wake in wakes:
        await faulty.queue.send(wake)
    await faulty.queue.until(lambda: len(faulty.queue.answers) >= answered + 3)
    late = faulty.queue.answers[answered:]
    assert [a.result for a in late] == [messages.ACK] * 3
    assert len(replays) == before, "the wakes found nothing new and replayed nothing"
    quiet = {id(a.meta) for a in late}
    assert not [t for t in faulty.trace if t.by and id(t.by.meta) in quiet], "a no-op wake acted"
    await run.cancel()


async def test_a_run_of_an_unknown_format_is_left_untouched(
    tmp_path: Path, make_app: MakeApp
) -> None:
    """H5: a run stamped with a spec version this worker lacks is not replayed or written."""
    world = await LocalWorld(tmp_path / "world", tuning=TUNING).open()
    app = make_app(world=world)

    @app.workflow
    async def flow() -> str:
        return "ran"

    run = await world.runs.create(
        workflow_name="flow", input={"args": [], "kwargs": {}}, deployment_id="local",
        spec_version=8,
    )  # fmt: skip
    await world.queue.send(messages.OrchestratorMessage(run_id=run.run_id, run_spec_version=8))
    await app.world()
    await asyncio.sleep(0.5)  # the delivery happens within a dispatcher poll
    after = await world.runs.get(run.run_id)
    assert after.status == "pending"
    assert after.seq == 1
