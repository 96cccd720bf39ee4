"""Overlapping deliveries and timers that arrive while another delivery holds the run.

Seed 003 "Lease stall overlap", "Two deliveries of one message, one dies owing
a send", "A new wait's creator coalesced away" and "Coalesced timer losing its
re-arm" (EDGE-CASES A1, B2, C1, C3), on the local World with a short lease.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

from treadle import Hook, sleep
from treadle.world import contract, events, messages
from treadle.worlds.local import LocalWorld

from .conftest import MakeApp
from .faults import FaultyWorld

SHORT_LEASE = contract.QueueTuning(
    lease_seconds=0.6, backoff_base_seconds=0.05, backoff_max_seconds=0.2
)


async def _faulty(tmp_path: Path) -> FaultyWorld:
    return FaultyWorld(await LocalWorld(tmp_path / "world", tuning=SHORT_LEASE).open())


async def test_lease_stall_overlap_writes_nothing_twice(tmp_path: Path, make_app: MakeApp) -> None:
    """A1: D1 stalls in a CPU-bound inline body past its lease; the message goes to D2. The
    run completes, no event is written twice, and D1's late answer is not what acks it."""
    world = await _faulty(tmp_path)
    app = make_app(world=world)
    ran: Counter[str] = Counter()

    @app.step(max_retries=3)
    async def crunch() -> str:
        ran["crunch"] += 1
        if ran["crunch"] == 1:
            time.sleep(1.5)  # the stall under test: the event loop is blocked
        return "crunched"

    @app.workflow
    async def flow() -> str:
        return await crunch()

    run = await app.start(flow)
    assert await run.result(timeout=20) == "crunched"
    log = await run.events()
    assert [e.type for e in log].count("run_completed") == 1
    assert [e.type for e in log].count("step_completed") == 1

    # D1's late answer is dropped, so the lapsed message is delivered again. Whichever of
    # D1 and D2 wrote first, the other is refused (Redeliver(1)); a later delivery acks.
    def acked_again() -> bool:
        return any(
            a.meta.delivery_count >= 2 and a.result == messages.ACK
            for a in world.queue.orchestrator_answers()
        )

    deadline = time.monotonic() + 10
    while not acked_again():
        assert time.monotonic() < deadline, "the lapsed message was never delivered and acked"
        await asyncio.sleep(0.02)  # the dispatcher's next claim: nothing to await on


async def test_a_delivery_stalled_owing_a_send_is_covered_by_the_redelivery(
    tmp_path: Path, make_app: MakeApp
) -> None:
    """B2: D1 commits step_created and stalls before its send, then fails; the message's
    redelivery (counted above 1) re-sends the step under its key; the step runs once."""
    world = await _faulty(tmp_path)
    app = make_app(world=world, WORKFLOW_MAX_INLINE_STEPS=0)
    ran: Counter[str] = Counter()

    @app.step
    async def work() -> str:
        ran["work"] += 1
        return "worked"

    @app.workflow
    async def flow() -> str:
        return await work()

    stalled: list[bool] = []

    def stall_then_fail(send: messages.Send) -> bool:
        if isinstance(send.message, messages.StepMessage) and not stalled:
            stalled.append(True)
            time.sleep(1.0)  # past the 0.6 s lease, owing this send
            return True
        return False

    world.queue.fail_sends(1, when=stall_then_fail)
    run = await app.start(flow)
    assert await run.result(timeout=20) == "worked"
    assert ran == Counter({"work": 1})
    resent = [s for s in world.queue.sent if getattr(s.message, "step_resent", False)]
    assert resent, "the redelivery re-sent the step its first delivery owed"


class Ping(Hook):
    n: int


async def test_a_new_waits_creator_dying_after_the_commit(
    tmp_path: Path, make_app: MakeApp
) -> None:
    """C1: the timer went out before wait_created committed; the creator then fails (its
    answer lost). The wait still completes at its time, and not before."""
    world = await _faulty(tmp_path)
    app = make_app(world=world)

    @app.workflow
    async def flow() -> str:
        await sleep(0.5)
        return "woke"

    inner_batch = world.events.create_batch
    failed: list[bool] = []

    async def lose_the_answer(run_id: str, batch: Any, **kw: Any) -> Any:
        result = await inner_batch(run_id, batch, **kw)
        if not failed and any(e.type == "wait_created" for e in batch):
            failed.append(True)
            raise ConnectionError("injected: the answer to wait_created was lost")
        return result

    world.events.create_batch = lose_the_answer  # type: ignore[method-assign]
    started = time.monotonic()
    run = await app.start(flow)
    assert await run.result(timeout=20) == "woke"
    assert time.monotonic() - started >= 0.5
    log = await run.events()
    assert [e.type for e in log].count("wait_created") == 1
    created = next(e for e in log if e.type == "wait_created")
    done = next(e for e in log if e.type == "wait_completed")
    assert isinstance(created.event, events.WaitCreated)
    assert done.created_at >= created.event.resume_at


async def test_a_timer_due_while_a_delivery_holds_the_run_is_coalesced(
    tmp_path: Path, make_app: MakeApp
) -> None:
    """C3: the wait's timer comes due while a lingering delivery holds the run (an open
    hook); it is folded into the holder, which completes the wait; nothing is lost."""
    world = await _faulty(tmp_path)
    app = make_app(world=world, WORKFLOW_ORCHESTRATOR_LINGER_MS=5000)

    @app.workflow
    async def flow() -> str:
        ping = asyncio.ensure_future(Ping.wait(token="never-resumed"))
        await sleep(0.4)
        ping.cancel()
        return "slept"

    run = await app.start(flow)
    assert await run.result(timeout=20) == "slept"
    answers = world.queue.orchestrator_answers()
    alone = [a for a in answers if a.meta.rerun == 0 and a.meta.delivery_count == 1]
    assert len(alone) == 1, "the timer was not delivered on its own: the holder absorbed it"
    assert [e.type for e in await run.events()].count("wait_completed") == 1
