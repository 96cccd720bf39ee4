"""Audit rows that had no test after session 4's other helpers (tests/engine/AUDIT-ROWS.md).

FO1 / F4 (inline slots already taken by running bodies) and G5 / RT14 / T14 (a
re-published copy of a run's start message, which keeps ``run_input`` and goes
turbo against a synthesized log). Both run on every World of the ``faulty`` fixture
(local, and Postgres + NATS on real servers) and wait on recorded events.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from treadle import Hook
from treadle.world import events, messages

from .audit import assert_sound, cold_outcome, types
from .conftest import MakeApp
from .faults import FaultyWorld


class Go(Hook):
    n: int


async def test_running_inline_bodies_use_up_the_slots_of_a_later_creation(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit FO1 and F4 ("running steps use up slots") / seed 003 "Inline slots already
    taken": with 3 inline slots, ``gather(long(), branch())`` starts long and quick
    inline; quick settles while long still runs, so the next pass creates fan 0..2 with
    one slot taken: two of them start inline, the third is created for its own message.
    long is held until that creation has committed, so the slot is really in use.

    Seen to fail (both Worlds): ``InlineRunner.slots`` returning
    ``WORKFLOW_MAX_INLINE_STEPS`` alone (``- len(self._tasks)`` removed in
    runtime/treadle/orchestrator/inline.py): all three fan steps start inline."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=3)
    now: Counter[str] = Counter()  # "running": bodies running now; "most": the peak
    ran: Counter[str] = Counter()
    release = asyncio.Event()

    def began(name: str) -> None:
        ran[name] += 1
        now["running"] += 1
        now["most"] = max(now["most"], now["running"])

    @app.step
    async def long() -> str:
        began("long")
        try:
            await release.wait()
            return "long"
        finally:
            now["running"] -= 1

    @app.step
    async def quick() -> int:
        began("quick")
        now["running"] -= 1
        return 1

    @app.step
    async def fan(i: int) -> int:
        began(f"fan{i}")
        now["running"] -= 1
        return i

    async def branch() -> list[int]:
        await quick()
        return list(await asyncio.gather(*(fan(i) for i in range(3))))

    @app.workflow
    async def flow() -> list[object]:
        return list(await asyncio.gather(long(), branch()))

    run = await app.start(flow)

    def fan_created() -> int:
        return sum(
            1
            for t in faulty.trace
            if t.what == "write"
            and t.name in ("step_started", "step_created")
            and t.correlation_id is not None
            and t.by is not None
            and t.by.kind == "orchestrator"
        )

    # long, quick, then the three fan creations: five creating writes by the orchestrator.
    await faulty.queue.until(lambda: fan_created() >= 5)
    # The background fan step may run before long is released; the inline ones did.
    await faulty.queue.until(lambda: sum(ran[f"fan{i}"] for i in range(3)) == 3)
    release.set()
    assert await run.result(timeout=30) == ["long", [0, 1, 2]]

    log = await assert_sound(run)
    firsts = {
        e.event.correlation_id: e.event
        for e in reversed(log)
        if isinstance(e.event, events.StepStarted | events.StepCreated)
        and e.event.step_name == "fan"
    }
    inline = sorted(
        str(ev.input) for ev in firsts.values() if isinstance(ev, events.StepStarted) and ev.inline
    )
    created = [ev for ev in firsts.values() if isinstance(ev, events.StepCreated)]
    assert len(inline) == 2, f"one slot was taken by long: {firsts}"
    assert len(created) == 1 and created[0].creator_message_id
    assert now["most"] <= 3, (
        "never more bodies at once than the inline slots (the 3rd fan is background)"
    )
    assert ran == Counter({"long": 1, "quick": 1, "fan0": 1, "fan1": 1, "fan2": 1})
    assert cold_outcome(flow, log) == ("completed", ["long", [0, 1, 2]])


async def test_a_re_published_start_copy_of_a_running_run_changes_nothing(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Audit G5, RT14 and T14 / seed 003 "Rotated start message re-entering turbo": the run
    ran step a inline and waits on a hook, its delivery acked. A copy of its start message
    (a retried ``start_run`` send, or a re-route: it keeps ``run_input``) is delivered as a
    first delivery. Turbo is taken only from the run's record, and only while the run is
    pending with nothing after its creation (security review H2,
    ``turbo_start_from_record``): this run is running, so the copy loads the real log,
    finds nothing new and acks, with no write and no body. One run_started, a ran once,
    the run then completes.

    Seen to fail: ``turbo_start_from_record`` made to synthesize the log whatever the
    record says (the pending check removed): the copy goes turbo, its run_started is refused by the
    fence and it answers Redeliver(1), not Ack."""
    app = make_app(world=faulty)
    ran: Counter[str] = Counter()

    @app.step
    async def a() -> str:
        ran["a"] += 1
        return "a"

    @app.workflow
    async def flow() -> str:
        got = await a()
        go = await Go.wait(token="rt14-go")
        return f"{got}{go.n}"

    run = await app.start(flow)
    await faulty.queue.until(
        lambda: any(x.result == messages.ACK for x in faulty.queue.orchestrator_answers())
    )
    assert ran["a"] == 1
    (start,) = [
        s
        for s in faulty.queue.sent
        if isinstance(s.message, messages.OrchestratorMessage) and s.message.run_input
    ]
    first = faulty.queue.orchestrator_answers()[0].meta.message_id
    for _ in range(5):
        # The spy records the ACK a moment before the queue releases the run's gate; a
        # copy arriving in that moment is coalesced into a re-run of the first delivery
        # (which finds nothing new and acks). Send another copy until one is delivered
        # as a message of its own, which is the timeline under test.
        answered = len(faulty.queue.orchestrator_answers())
        await faulty.queue.send(start.message)  # unkeyed: the copy is a new message
        await faulty.queue.until(lambda n=answered: len(faulty.queue.orchestrator_answers()) > n)
        got = faulty.queue.orchestrator_answers()[answered]
        if got.meta.message_id != first:
            break
        assert got.result == messages.ACK and ran["a"] == 1
    copy = faulty.queue.orchestrator_answers()[answered]
    assert copy.meta.delivery_count == 1 and copy.result == messages.ACK
    assert ran["a"] == 1, "no body ran for the copy"
    assert types(await run.events()).count("run_started") == 1

    await app.resume_hook("rt14-go", Go(n=14))
    assert await run.result(timeout=20) == "a14"
    log = await assert_sound(run)
    assert types(log).count("run_started") == 1
    assert [e.event.step_name for e in log if isinstance(e.event, events.StepStarted)] == ["a"]
    assert ran["a"] == 1
