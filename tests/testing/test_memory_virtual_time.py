"""The in-memory World on a virtual-time loop: no wall clock, no wait, one outcome per seed.

SIM-INTERFACE.md: every time read through ``treadle.clock`` and every delay, lease and
backoff an asyncio timer, so under a virtual-time loop they pass at once; the same
inputs and seed give the same log. Also pins the fix of a spin found under the
simulation: a due time a float rounding short of the clock's "now" set a zero-length
timer, so a virtual-time loop could run for ever without moving time on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from treadle import Workflows, clock, settings, sleep
from treadle.testing.memory import MemoryBackend, MemoryWorld
from treadle.world import contract, messages

from .memory_support import Deliveries, VirtualClock, VirtualTimeLoop, step_message

T = TypeVar("T")
TUNING = contract.QueueTuning(lease_seconds=30.0, backoff_base_seconds=1.0)


def _virtually(main: Callable[[], Awaitable[T]], seed: int = 1) -> tuple[T, VirtualTimeLoop]:
    loop = VirtualTimeLoop()
    try:
        with clock.use(VirtualClock(loop, seed)):
            return loop.run_until_complete(main()), loop
    finally:
        loop.close()


def test_delays_and_redeliveries_pass_at_once_in_virtual_time() -> None:
    """A 1 h delay and a 10 min Redeliver take no wall time and few loop turns, with two
    processes' consumers waiting (their timers used to keep the loop from moving on)."""
    backend = MemoryBackend()
    world, other = MemoryWorld(backend, tuning=TUNING), MemoryWorld(backend, tuning=TUNING)
    handler = Deliveries()

    async def main() -> list[float]:
        seen: list[float] = []

        async def redeliver_once(
            message: messages.OrchestratorMessage | messages.StepMessage,
            meta: messages.DeliveryMeta,
        ) -> messages.HandlerResult:
            seen.append(clock.monotonic())
            await handler(message, meta)
            return messages.Redeliver(600) if meta.delivery_count == 1 else messages.ACK

        consumer = await world.queue.consume({"step": redeliver_once})
        await other.queue.consume({"step": redeliver_once})
        # 1.1 s: clock.monotonic() (1000 + loop time) rounds differently from the loop.
        await asyncio.sleep(1.1)
        sent_at = clock.monotonic()
        await world.queue.send(step_message(), delay_seconds=3600)
        await handler.next(timeout=5000)  # virtual seconds
        await handler.next(timeout=5000)
        await consumer.close(grace_seconds=0)
        await other.close()
        return [t - sent_at for t in seen]

    started = time.monotonic()
    offsets, loop = _virtually(main)
    assert time.monotonic() - started < 5
    assert offsets[0] >= 3600 - 1e-6 and offsets[1] - offsets[0] >= 600 - 1e-6
    assert loop.vtime >= 4200
    assert loop.iterations < 1000, "the loop spun without moving virtual time on"


async def _app_log(n: int) -> list[tuple[str, str, float]]:
    backend = MemoryBackend(tuning=TUNING)
    world = MemoryWorld(backend, name="p1")
    tuned = settings.load({}, WORKFLOW_ORCHESTRATOR_LINGER_MS=300)
    app = Workflows(world=world, worker=True, settings_=tuned)

    @app.step
    async def work(i: int) -> int:
        return i

    @app.workflow
    async def flow(count: int) -> int:
        total = sum(await asyncio.gather(*(work(i) for i in range(count))))
        await sleep(7200)
        return total

    try:
        run = await app.start(flow, n)
        assert await run.result(timeout=30_000) == sum(range(n))
    finally:
        await app.close(grace_seconds=0)
        await world.close()
    return [
        (e.type, e.correlation_id or "", e.created_at.timestamp())
        for e in backend.events_of(run.run_id)
    ]


def test_an_app_with_a_two_hour_sleep_runs_in_virtual_time_and_replays_by_seed() -> None:
    """A fan-out and a 2 h sleep end at once; the same seed gives the same log twice."""
    started = time.monotonic()
    first, loop = _virtually(lambda: _app_log(10), seed=7)
    again, _ = _virtually(lambda: _app_log(10), seed=7)
    assert time.monotonic() - started < 20
    assert loop.vtime >= 7200
    assert first[-1][0] == "run_completed"
    assert first == again


def test_a_lapsing_lease_moves_virtual_time_on() -> None:
    """A killed process's lease lapses once its heartbeat is liveness_seconds old (before
    its lease_seconds: ``treadle.world.liveness``) in virtual time, without a spin."""
    backend = MemoryBackend()
    dying, survivor = MemoryWorld(backend, tuning=TUNING), MemoryWorld(backend, tuning=TUNING)

    async def main() -> tuple[messages.DeliveryMeta, float]:
        stuck = Deliveries()
        stuck.hold = True
        await dying.queue.consume({"step": stuck})
        await survivor.queue.send(step_message())
        await stuck.next()
        killed_at = clock.monotonic()
        dying.kill()
        taker = Deliveries()
        consumer = await survivor.queue.consume({"step": taker})
        meta = await taker.next(timeout=5000)
        waited = clock.monotonic() - killed_at
        stuck.release.set()
        await consumer.close(grace_seconds=0)
        await dying.close()
        return meta, waited

    (meta, waited), loop = _virtually(main)
    assert (meta.delivery_count, meta.attempt) == (2, 2)
    assert TUNING.liveness_seconds < TUNING.lease_seconds
    assert 0 < waited <= TUNING.liveness_seconds + 0.001
    assert loop.iterations < 1000, "the loop spun without moving virtual time on"


def test_a_due_time_a_rounding_past_the_loops_timer_does_not_stall_virtual_time() -> None:
    """(1000 + 0.1) + 1.2 > 1000 + (0.1 + 1.2) in floats: at its timer the message looks
    1e-13 s short of due. Two processes wait; it is delivered and virtual time moves on.
    (Under the simulation's loop such a due time made two consumers' zero-length timers
    spin at one instant; the queue's timers are now at least MIN_WAIT_SECONDS.)"""
    backend = MemoryBackend()
    worlds = [MemoryWorld(backend, tuning=TUNING) for _ in range(2)]
    handler = Deliveries()

    async def main() -> float:
        for world in worlds:
            await world.queue.consume({"step": handler})
        await asyncio.sleep(0.1)
        sent_at = clock.monotonic()
        await worlds[0].queue.send(step_message(), delay_seconds=1.2)
        await handler.next(timeout=60)
        waited = clock.monotonic() - sent_at
        for world in worlds:
            await world.close()
        return waited

    waited, loop = _virtually(main)
    assert 1.2 - 1e-6 <= waited < 1.3
    assert loop.iterations < 1000, "the loop spun without moving virtual time on"
