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
def skewed() -> Iterator[dict[str, list[float]]]:
    """``{"plan": offsets}``: the n-th timer message delivered (every delivery of it) runs
    ``offsets[n]`` seconds off the real time, later ones and all others on it."""
    offsets: dict[str, float] = {}
    order: list[str] = []
    plan: list[float] = []

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
        return offsets[mid]

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
    faulty: FaultyWorld, make_app: MakeApp, skewed: dict[str, list[float]]
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
    re-arm and ``run.result`` times out (seen on local and postgres+nats); so does
    ``near_due_key`` without its seconds part where a re-arm goes out near due."""
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
    by_delivery = Counter(id(t.by) for t in sends if t.by is not None and t.by.kind)
    assert max(by_delivery.values()) <= 2, [t.name for t in sends]
    rearms = [t.name for t in sends if re.search(r":a\d+$", t.name)]
    assert len(rearms) == len(set(rearms)) >= 2, f"re-arms under one key: {rearms}"
