"""The in-memory World's fault points: what an interceptor's answer does at each one.

SIM-INTERFACE.md "treadle.testing.memory": the interceptor is awaited at the start of
every storage and queue call and before each delivery, settlement and renewal; it may
raise (nothing done), block, return "lose" or "fail_after" (done, then raised).
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from treadle import errors
from treadle.testing.memory import POINTS, Interference, MemoryBackend, MemoryWorld
from treadle.world import constants, events, messages, records

from .memory_support import FAST, Deliveries, Scripted, orchestrator_message, step_message

SPEC = constants.SPEC_VERSION_SINGLE_ORCHESTRATOR


async def _run(world: MemoryWorld) -> str:
    run = await world.runs.create(
        workflow_name="wf", input=None, deployment_id="d", spec_version=SPEC
    )
    return run.run_id


async def test_every_point_is_awaited_with_its_run_id() -> None:
    """Each storage and queue call, delivery, settlement, renewal and heartbeat passes its
    point."""
    renewed, beaten = asyncio.Event(), asyncio.Event()

    class Recording(Scripted):
        async def before(self, point: str, run_id: str | None) -> Interference:
            if point == "queue.renew":
                renewed.set()
            if point == "queue.beat":
                beaten.set()
            return await super().before(point, run_id)

    interceptor = Recording()
    world = MemoryWorld(MemoryBackend(), tuning=FAST, interceptor=interceptor)
    run_id = await _run(world)
    await world.runs.get(run_id)
    await world.runs.list()
    await world.runs.count(deployment_id="d", limit=1)
    await world.events.create(run_id, events.AttrSet(key="a"), in_band=False)
    await world.events.create_batch(
        run_id, [events.StepCreated(correlation_id="s1", step_name="f")], in_band=False
    )
    await world.events.list(run_id)
    await world.events.list_entity(run_id, "s1")
    await world.steps.list(run_id)
    await world.steps.get(run_id, "s1")
    await world.events.create(
        run_id, events.HookCreated(correlation_id="h1", token="t1"), in_band=False
    )
    await world.hooks.get_by_token("t1")
    await world.deployments.register("d")
    await world.deployments.get("d")
    await world.deployments.latest()
    await world.deployments.list()
    await world.deployments.promote("d")
    await world.deployments.register("d2")
    await world.runs.repin(run_id, from_deployment="d", to_deployment="d2")
    await world.deployments.retire("d")
    spec = records.ScheduleSpec("s", "wf", "* * * * *", "UTC", "skip", 60.0, None)
    put = await world.schedules.put(spec, next_fire_at=None)
    await world.schedules.get("s")
    await world.schedules.list()
    claimed = dataclasses.replace(put.state, skipped=1)  # a won claim: schedules.claimed too
    assert await world.schedules.update("s", expected_version=put.version, state=claimed)
    await world.schedules.delete("s")

    async def slow(message: object, meta: messages.DeliveryMeta) -> messages.Ack:
        await renewed.wait()  # held until a heartbeat renewed the lease
        await beaten.wait()  # and the worker beat once (liveness)
        return messages.ACK

    consumer = await world.queue.consume({"step": slow})
    await world.queue.send(step_message(run_id))
    await asyncio.wait_for(renewed.wait(), 10)
    await asyncio.wait_for(beaten.wait(), 10)
    await consumer.close(grace_seconds=5)
    await world.close()
    assert interceptor.points() == POINTS
    assert ("queue.settle", run_id) in interceptor.seen
    assert ("events.create", run_id) in interceptor.seen
    assert ("runs.repin", run_id) in interceptor.seen


async def test_a_raise_fails_the_call_before_anything_is_written() -> None:
    """An interceptor raising StorageUnavailable at events.create: the log is unchanged."""
    down = errors.StorageUnavailable("injected")
    interceptor = Scripted({"events.create": [down]})
    backend = MemoryBackend()
    world = MemoryWorld(backend, interceptor=interceptor)
    run_id = await _run(world)
    with pytest.raises(errors.StorageUnavailable):
        await world.events.create(run_id, events.AttrSet(key="a"), in_band=False)
    assert [e.type for e in backend.events_of(run_id)] == ["run_created"]


async def test_fail_after_commits_the_write_then_raises() -> None:
    """ "fail_after" at events.create: the event is in the log, the caller hears an error."""
    interceptor = Scripted({"events.create": ["fail_after"]})
    backend = MemoryBackend()
    world = MemoryWorld(backend, interceptor=interceptor)
    run_id = await _run(world)
    with pytest.raises(errors.StorageUnavailable):
        await world.events.create(run_id, events.AttrSet(key="a"), in_band=False)
    assert [e.type for e in backend.events_of(run_id)] == ["run_created", "attr_set"]
    assert backend.run_record(run_id).seq == 2


async def test_a_lost_send_reports_success_and_drops_the_message() -> None:
    """ "lose" at queue.send: a message id comes back, nothing is queued or delivered."""
    backend = MemoryBackend()
    world = MemoryWorld(backend, tuning=FAST, interceptor=Scripted({"queue.send": ["lose"]}))
    message = step_message()
    sent = await world.queue.send(message, key="k")
    assert sent.message_id.startswith("msg_") and not sent.deduplicated
    assert backend.queued() == 0
    assert backend.stats.of(message.run_id).lost_sends == 1
    # The key was not taken by the lost message: a re-send makes the message.
    again = await world.queue.send(message, key="k")
    assert not again.deduplicated
    assert backend.queued() == 1


async def test_fail_after_in_a_batch_sends_up_to_that_message_then_raises() -> None:
    """send_batch asks once per message; "fail_after" on the first sends it and stops."""
    backend = MemoryBackend()
    interceptor = Scripted({"queue.send": ["fail_after"]})
    world = MemoryWorld(backend, interceptor=interceptor)
    first, second = step_message(step_id="a"), step_message(step_id="b")
    with pytest.raises(errors.StorageUnavailable):
        await world.queue.send_batch([messages.Send(first), messages.Send(second)])
    assert backend.queued() == 1
    assert [p for p, _ in interceptor.seen] == ["queue.send"]


async def test_a_blocked_call_waits_while_another_process_goes_on() -> None:
    """A stalled process's call does not return until released; others are unaffected."""
    backend = MemoryBackend()
    stall = asyncio.Event()
    stalled = MemoryWorld(backend, interceptor=Scripted({"runs.get": [stall]}))
    other = MemoryWorld(backend)
    run_id = await _run(other)
    blocked = asyncio.create_task(stalled.runs.get(run_id))
    await other.events.create(run_id, events.AttrSet(key="a"), in_band=False)
    await asyncio.sleep(0.05)
    assert not blocked.done()
    stall.set()
    # It reads the World as it is when it proceeds, not as it was when it was called.
    assert (await asyncio.wait_for(blocked, 10)).seq == 2


async def test_a_lost_settlement_leaves_the_message_to_be_delivered_again() -> None:
    """ "lose" at queue.settle: the ack never lands; after the lease the message comes back."""
    backend = MemoryBackend()
    world = MemoryWorld(backend, tuning=FAST, interceptor=Scripted({"queue.settle": ["lose"]}))
    handler = Deliveries()
    consumer = await world.queue.consume({"orchestrator": handler})
    try:
        sent = await world.queue.send(orchestrator_message(step_message().run_id))
        first, second = await handler.next(), await handler.next()
    finally:
        await consumer.close(grace_seconds=1)
    assert first.message_id == second.message_id == sent.message_id
    assert (second.delivery_count, second.attempt) == (2, 2)
    assert backend.stats.total.lease_lapses == 1
    assert backend.queued() == 0


async def test_a_raise_before_delivery_leaves_the_lease_to_lapse() -> None:
    """An interceptor raising at queue.deliver: no handler call; redelivered, counted."""
    backend = MemoryBackend()
    down = errors.StorageUnavailable("injected")
    world = MemoryWorld(backend, tuning=FAST, interceptor=Scripted({"queue.deliver": [down]}))
    handler = Deliveries()
    consumer = await world.queue.consume({"step": handler})
    try:
        await world.queue.send(step_message())
        meta = await handler.next()
    finally:
        await consumer.close(grace_seconds=1)
    assert (meta.delivery_count, meta.attempt) == (2, 2)
    assert len(handler.calls) == 1
