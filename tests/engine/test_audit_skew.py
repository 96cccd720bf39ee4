"""Audit TE11 / seed 003 "Timers and waits": re-arm keys under clock skew.

Each delivery of a wait's timer runs on a clock of its own, as if every delivery
went to another process whose clock is off by a set offset: ``SkewedClock``
(installed with ``treadle.clock.use``) reads the real time plus the offset named
for the delivery in hand (``faults.CURRENT``); the monotonic clock stays real.
Neither queue reads ``treadle.clock``: the local queue's delays and key windows
run on the system clock (``worlds/local/database.now_us``) and NATS schedules on
``time.time()`` and the server's clock, so on both Worlds only the
orchestrator's view of "now" (is the wait due? which second's key?) is skewed,
against a queue that keeps the real time: the disagreement of the audit row.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from treadle import clock, sleep
from treadle.world import events, messages

from .audit import assert_sound, types
from .conftest import MakeApp
from .faults import CURRENT, FaultyWorld, Started


class SkewedClock:
    """The real clock, ``offset(delivery)`` seconds off for the delivery in hand."""

    def __init__(self, offset: Callable[[Started], float]) -> None:
        self._offset = offset

    def time(self) -> float:
        started = CURRENT.get()
        return time.time() + (0.0 if started is None else self._offset(started))

    def monotonic(self) -> float:
        return time.monotonic()

    def random_bytes(self, n: int) -> bytes:
        return os.urandom(n)


@pytest.fixture
def skewed() -> Iterator[dict[str, list[float | tuple[float, ...]]]]:
    """``{"plan": offsets}``: the n-th timer message delivered runs ``offsets[n]`` seconds
    off the real time (a tuple: one offset per attempt), later ones and all others on it."""
    offsets: dict[str, float | tuple[float, ...]] = {}
    order: list[str] = []
    plan: list[float | tuple[float, ...]] = []

    def offset(started: Started) -> float:
        message = started.message
        if not (
            isinstance(message, messages.OrchestratorMessage)
            and message.wait_continuation is not None
        ):
            return 0.0
        mid = started.meta.message_id
        if mid not in offsets:
            # The n-th timer message met goes to the n-th process of the plan (then real time).
            order.append(mid)
            offsets[mid] = plan[len(order) - 1] if len(order) <= len(plan) else 0.0
        planned = offsets[mid]
        if isinstance(planned, tuple):  # one offset per attempt: each went to another process
            return planned[min(started.meta.attempt, len(planned)) - 1]
        return planned

    with clock.use(SkewedClock(offset)):
        yield {"plan": plan}


def _story(world: FaultyWorld) -> list[str]:
    """The timer sends (key, delay) and timer deliveries (message, attempt), in order."""
    out = []
    for t in world.trace:
        if t.what == "send" and t.send is not None and t.correlation_id is not None:
            out.append(f"send {t.name} +{t.send.delay_seconds:.2f}s")
    for s in world.queue.started:
        if isinstance(s.message, messages.OrchestratorMessage) and s.message.wait_continuation:
            out.append(f"delivered {s.meta.message_id} a{s.meta.attempt} key={s.meta.key}")
    return out


def _is_timer(s: Started, wait_id: str) -> bool:
    m = s.message
    return (
        isinstance(m, messages.OrchestratorMessage)
        and m.wait_continuation is not None
        and m.wait_continuation.correlation_id == wait_id
    )


async def test_an_early_re_arm_delivered_early_again_re_arms_under_a_new_key(
    faulty: FaultyWorld, make_app: MakeApp, skewed: dict[str, list[float | tuple[float, ...]]]
) -> None:
    """Audit TE11 (and TE6 twice over): a 4 s sleep, created on a clock that agrees with
    the queue's. Its final timer (the hop's key) reaches a process whose clock is 2.5 s
    behind: early there, it re-arms the wait (``:a2``, due in about 2.5 s). That re-arm,
    a new message on its first attempt, reaches a process 8 s behind: early again, it
    re-arms once more. Under a key of the hop and the attempt alone that second re-arm is
    ``:a2`` again, the key of the very message in hand: the queue's deduplication drops
    it, no timer is left and the wait never completes. Every later timer reaches a
    process on the real time. Asserts the run completes, one ``wait_completed`` for the
    wait, not before it was due, and at most two timer sends per re-arming delivery.

    Fails when broken: ``WaitArmer.arm_owned_chains`` re-arming under
    ``suffix=f"a{attempt + 1}"`` alone (the key before this test's fix) drops the second
    re-arm and ``run.result`` times out (seen on local and postgres+nats). (No delivery
    here is counted above 1, so ``near_due_key`` is not on this path.)"""
    skewed["plan"].extend([-2.5, -8.0])
    app = make_app(world=faulty)

    @app.workflow
    async def flow() -> str:
        await sleep(4)
        return "slept"

    run = await app.start(flow)
    try:
        assert await run.result(timeout=30) == "slept"
    except TimeoutError:
        pytest.fail(f"the wait never completed; timer sends and deliveries: {_story(faulty)}")
    log = await assert_sound(run)
    (created,) = [e for e in log if isinstance(e.event, events.WaitCreated)]
    wait_id = created.correlation_id or ""
    done = [e for e in log if e.type == "wait_completed" and e.correlation_id == wait_id]
    assert len(done) == 1, types(log)
    assert done[0].created_at >= created.event.resume_at

    deliveries = [s for s in faulty.queue.started if _is_timer(s, wait_id)]
    assert len({s.meta.message_id for s in deliveries}) >= 3, (
        "the timeline needs the hop and two re-arms: "
        f"{[(s.meta.message_id, s.meta.attempt) for s in deliveries]}"
    )
    sends = [
        t
        for t in faulty.trace
        if t.what == "send" and t.correlation_id == wait_id and t.send is not None
    ]
    by_delivery = Counter(id(t.by) for t in sends if t.by is not None)
    assert max(by_delivery.values()) <= 2, [t.name for t in sends]
    rearms = [t.name for t in sends if re.search(r":a\d+$", t.name)]
    assert len(rearms) == len(set(rearms)) >= 2, f"re-arms under one key: {rearms}"


async def test_two_processes_a_second_apart_re_arming_one_early_timer_complete_it_once(
    faulty: FaultyWorld, make_app: MakeApp, skewed: dict[str, list[float | tuple[float, ...]]]
) -> None:
    """Audit TE11 / TE10 / seed 003 "Why the second, once more": a 3 s sleep's final timer
    reaches a process 1.5 s behind: early, it re-arms the wait, then its answer is lost
    (the process dies after its send). The queue redelivers the timer to a process 2.5 s
    behind, a second further back: early again, it re-arms too, under the next attempt's
    key. Two re-arms for one wait, one per re-arming delivery: the first due completes
    the wait, the other finds it completed and queues nothing. Asserts the run completes,
    exactly one ``wait_completed``, at most two timers re-armed (one per delivery) and
    at most two timer sends per delivery.

    Fails when broken: re-arming under the hop's own key (``suffix=None`` in
    ``WaitArmer.arm_owned_chains``) has both re-arms dropped as duplicates of the timer
    in hand and the wait never completes."""
    skewed["plan"].append((-1.5, -2.5))
    app = make_app(world=faulty)
    faulty.queue.lose_answers(1, when=lambda s: isinstance(s.message, messages.OrchestratorMessage)
                              and s.message.wait_continuation is not None)  # fmt: skip

    @app.workflow
    async def flow() -> str:
        await sleep(3)
        return "slept"

    run = await app.start(flow)
    try:
        assert await run.result(timeout=30) == "slept"
    except TimeoutError:
        pytest.fail(f"the wait never completed; timer sends and deliveries: {_story(faulty)}")
    log = await assert_sound(run)
    (created,) = [e for e in log if isinstance(e.event, events.WaitCreated)]
    wait_id = created.correlation_id or ""
    done = [e for e in log if e.type == "wait_completed" and e.correlation_id == wait_id]
    assert len(done) == 1, types(log)
    assert done[0].created_at >= created.event.resume_at

    deliveries = [s for s in faulty.queue.started if _is_timer(s, wait_id)]
    hop = deliveries[0].meta.message_id
    early = [s for s in deliveries if s.meta.message_id == hop]
    assert [s.meta.attempt for s in early][:2] == [1, 2], _story(faulty)
    sends = [
        t
        for t in faulty.trace
        if t.what == "send" and t.correlation_id == wait_id and t.send is not None
    ]
    rearms = [t for t in sends if re.search(r":a\d+$", t.name)]
    assert len(rearms) == 2 == len({t.name for t in rearms}), _story(faulty)
    assert {id(t.by) for t in rearms} == {id(s) for s in early[:2]}, _story(faulty)
    by_delivery = Counter(id(t.by) for t in sends if t.by is not None)
    assert max(by_delivery.values()) <= 2, _story(faulty)
