"""Audit rows on what a delivery re-arms and how much work an idle or busy delivery does
(seed 003 "Run lifecycle edge cases", "Timers and waits", "Live feed"; audit RL7, TE7,
BF5, FO11).

Timers are skewed early with ``FaultyQueue.skew_sends`` (a clock skew): only a
delivery that re-arms the wait, under a key the queue has not seen, lets the wait
complete. Passes are counted by a spy on ``Replay.advance`` (the real method, counted),
log reads and feed pushes by ``FaultyEvents.reads`` / ``pushed``.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest

from treadle import Hook, sleep
from treadle.replay import engine
from treadle.world import messages

from .audit import assert_sound, types
from .conftest import MakeApp
from .faults import FaultyWorld, Started, Traced


class Ping(Hook):
    n: int


def _timer_sends(world: FaultyWorld) -> list[Traced]:
    return [
        t
        for t in world.trace
        if t.send is not None
        and isinstance(t.send.message, messages.OrchestratorMessage)
        and t.send.message.wait_continuation is not None
    ]


def _is_timer(s: Started) -> bool:
    return isinstance(s.message, messages.OrchestratorMessage) and (
        s.message.wait_continuation is not None
    )


def _plain_hop_key(s: messages.Send) -> bool:
    """A wait's timer under its hop's own key (no ``:s<second>`` / ``:a<n>`` suffix)."""
    return s.key is not None and re.fullmatch(r"wait:[^:]+:\d+:\d+", s.key) is not None


async def test_a_coalesced_re_run_of_a_waits_creator_re_arms_its_timer(
    faulty: FaultyWorld, make_app: MakeApp
) -> None:
    """Audit RL7 / seed 003 "Coalesced re-run of the wait's creator re-arms its timer": the
    start delivery creates a 10 s sleep and a hook, sends the sleep's timer (skewed to
    arrive 9.7 s early) and lingers on the open hook. The early timer is coalesced into
    it, so the queue re-runs the start message. The re-run, not the timer, owns the wait
    and re-arms it under its own second's key (the hop's key is spent); the wait
    completes once, on time. The 10 s keeps the wait outside the near-due window (5 s)."""
    app = make_app(world=faulty, WORKFLOW_ORCHESTRATOR_LINGER_MS=1500)
    faulty.queue.skew_sends(9.7, when=_plain_hop_key)

    @app.workflow
    async def flow() -> int:
        ping, _ = await asyncio.gather(Ping.wait(token="rl7-ping"), sleep(10))
        return ping.n

    started = time.monotonic()
    run = await app.start(flow)
    await faulty.queue.until(
        lambda: any(t.what == "write" and t.name == "wait_completed" for t in faulty.trace),
        timeout=30,
    )
    assert time.monotonic() - started >= 9.5, "the wait completed before it was due"
    await app.resume_hook("rl7-ping", Ping(n=7))
    assert await run.result(timeout=20) == 7
    log = await assert_sound(run)
    assert types(log).count("wait_completed") == 1
    start_id = faulty.queue.started[0].meta.message_id
    reruns = [s for s in faulty.queue.started if s.meta.message_id == start_id and s.meta.rerun]
    assert reruns, "the early timer was not coalesced into the lingering start delivery"
    rearms = [
        t
        for t in _timer_sends(faulty)
        if t.by is not None and t.by in reruns and re.search(r":s\d+$", t.name)
    ]
    assert rearms, f"the re-run re-armed nothing: {[t.name for t in _timer_sends(faulty)]}"


async def test_an_early_timer_with_nothing_new_skips_the_fast_path_and_re_arms(
    faulty: FaultyWorld, make_app: MakeApp
) -> None:
    """Audit TE7 / seed 003 "A timer delivery skips the no-op fast path": a 3 s sleep's timer
    arrives 2 s early, on its first delivery, to a process whose log is where it left it
    (the plain-wake fast path would ack it). A timer delivery always replays: it finds
    its wait not due and re-arms it under ``:a2``; the wait completes once, on time."""
    app = make_app(world=faulty)
    faulty.queue.skew_sends(2.0, when=_plain_hop_key)

    @app.workflow
    async def flow() -> str:
        await sleep(3)
        return "slept"

    started = time.monotonic()
    run = await app.start(flow)
    assert await run.result(timeout=20) == "slept"
    assert time.monotonic() - started >= 2.8
    log = await assert_sound(run)
    assert types(log).count("wait_completed") == 1
    timer_deliveries = [s for s in faulty.queue.started if _is_timer(s)]
    early = timer_deliveries[0]
    assert early.meta.delivery_count == 1
    rearm = [t for t in _timer_sends(faulty) if t.by is not None and t.by.meta == early.meta]
    # (Its own hop's key may go out again too: the queue folds it into the message in hand.)
    assert [t for t in rearm if t.name.endswith(":a2")], [t.name for t in rearm]


async def test_an_idle_delivery_polls_once_per_interval_whatever_its_pending_waits(
    faulty: FaultyWorld, make_app: MakeApp
) -> None:
    """Audit BF5 / seed 003 "Idle polls": a delivery lingering on an open hook, with 30
    pending sleeps, after three generations of passes (three hooks resumed in turn),
    reads the log about once per poll interval (200 ms) while idle: not once per wait
    per interval, nor once per generation."""
    app = make_app(
        world=faulty,
        WORKFLOW_ORCHESTRATOR_LINGER_MS=2000,
        WORKFLOW_ORCHESTRATOR_FEED_POLL_INTERVAL_MS=200,
    )

    @app.workflow
    async def flow() -> int:
        total = 0
        sleeps = [asyncio.ensure_future(sleep(120 + i)) for i in range(30)]
        for g in range(4):
            total += (await Ping.wait(token=f"bf5-{g}")).n
        for s in sleeps:
            s.cancel()
        return total

    run = await app.start(flow)

    def hooks() -> int:
        return len([t for t in faulty.trace if t.what == "write" and t.name == "hook_created"])

    for g in range(3):
        await faulty.queue.until(lambda g=g: hooks() > g)  # type: ignore[misc]
        await app.resume_hook(f"bf5-{g}", Ping(n=g))
    await faulty.queue.until(lambda: hooks() == 4)
    idle_from = time.monotonic()
    holder = [t for t in faulty.trace if t.name == "hook_created"][-1].by
    assert holder is not None
    # The lingering delivery ends when its linger (2 s of no news) is over.
    await faulty.queue.until(
        lambda: any(a.meta == holder.meta for a in faulty.queue.orchestrator_answers())
    )
    idle = time.monotonic() - idle_from
    reads = [t for t, by in faulty.events.reads if t >= idle_from and by is holder]
    assert types(await run.events()).count("wait_created") == 30
    assert idle >= 1.5, f"the holder lingered only {idle:.1f} s"
    bound = idle / 0.2 + 3
    assert len(reads) <= bound, f"{len(reads)} reads in {idle:.1f} s idle with 30 waits"
    await app.resume_hook("bf5-3", Ping(n=3))
    assert await run.result(timeout=20) == 6


async def test_the_feeds_echo_of_own_writes_starts_no_pass_in_a_fan_out(
    faulty: FaultyWorld, make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Audit FO11 / seed 003 "Feed echo of own writes": a fan-out of 10 inline steps whose
    outcomes land 0.1 s apart, with the live feed up. The feed pushes each of the
    delivery's own writes back to it; those echoes are not news: one pass per outcome
    (12 in all: the first, one per step, the last), never one more per echo."""
    passes: list[str] = []
    advance = engine.Replay.advance

    def counted(self: engine.Replay) -> Any:
        outcome = advance(self)
        passes.append(type(outcome).__name__)
        return outcome

    monkeypatch.setattr(engine.Replay, "advance", counted)
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=16)

    @app.step
    async def work(i: int) -> int:
        await asyncio.sleep(0.1 * i)
        return i

    @app.workflow
    async def flow() -> int:
        return sum(await asyncio.gather(*(work(i) for i in range(10))))

    run = await app.start(flow)
    assert await run.result(timeout=30) == 45
    await assert_sound(run)
    (delivery,) = faulty.queue.orchestrator_answers()
    own = {
        t.name for t in faulty.trace if t.what == "write" and t.by is not None
    }  # the delivery wrote every event of the run
    echoes = [e for e, by in faulty.events.pushed if by is not None and e.type in own]
    assert len(echoes) >= 10, f"the feed echoed only {len(echoes)} own writes"
    assert passes.count("Completed") == 1
    assert len(passes) <= 12, f"{len(passes)} passes for 10 inline outcomes: {passes}"
    assert delivery.result == messages.ACK
