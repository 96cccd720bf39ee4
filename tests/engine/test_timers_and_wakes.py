"""The no-op wake (audit RL3, HE4).

Long sleeps in hops and a cancel under a pending hop (audit C7) are in
``test_audit_timers.py``; a run of an unknown format (H5) in
``test_audit_lifecycle.py``; both on both Worlds.
"""

from __future__ import annotations

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
    for i, wake in enumerate(wakes, 1):  # one at a time, so none is coalesced into another
        await faulty.queue.send(wake)
        await faulty.queue.until(lambda i=i: len(faulty.queue.answers) >= answered + i)
    late = faulty.queue.answers[answered:]
    assert [a.result for a in late] == [messages.ACK] * 3
    assert len(replays) == before, "the wakes found nothing new and replayed nothing"
    quiet = {id(a.meta) for a in late}
    assert not [t for t in faulty.trace if t.by and id(t.by.meta) in quiet], "a no-op wake acted"
    await run.cancel()
