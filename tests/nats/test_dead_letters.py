"""Poison messages on both queues: dead letters, unreadable payloads, kinds not served.

Issue 10 item 3; security.md M1 (poison messages redelivered for ever, the
``KeyError: 'orchestrator'`` loop on a steps-only worker, the local dispatcher
parsing outside its guard). Each queue test runs on the local World's queue and
on NATS JetStream (real servers).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats.js.errors
import pytest

from treadle import errors
from treadle.world import contract, ids, messages, records
from treadle.world.conformance import queue as conformance
from treadle.world.conformance.queue import FAST, WAIT_SECONDS, Recorder
from treadle.worlds.local import LocalWorld
from treadle.worlds.nats import names

from .conftest import NatsHarness, NatsServer

CAP = 3
TUNING = dataclasses.replace(FAST, max_failed_deliveries=CAP)


class Queues:
    """Opens queues of one kind (local or NATS) that share their messages."""

    def __init__(self, kind: str, tmp_path: Path, nats_url: str | None) -> None:
        self.kind = kind
        self.tmp_path = tmp_path
        self.harness = NatsHarness(nats_url) if nats_url else None
        self.closers: list[Any] = []

    async def open(self) -> Any:
        if self.harness is not None:
            queue = await self.harness.connect(TUNING)
            self.closers.append(queue)
            return queue
        world = await LocalWorld(self.tmp_path / "world", tuning=TUNING).open()
        self.closers.append(world)
        return world.queue


@pytest.fixture(params=["local", "nats"])
async def queues(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Queues]:
    url = request.getfixturevalue("nats_server").url if request.param == "nats" else None
    made = Queues(request.param, tmp_path, url)
    yield made
    for closer in made.closers:
        await closer.close()


async def _dead(queue: contract.DeadLetters, count: int) -> list[records.DeadLetter]:
    """The dead letters once there are ``count`` of them (another task moves them)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while len(found := await queue.dead_letters()) < count:
        assert time.monotonic() < deadline, f"{len(found)} dead letters, expected {count}"
        await asyncio.sleep(0.05)  # polling the queue's state: no event announces a burial
    return found


class Boom(Exception):
    pass


async def test_a_message_failing_every_delivery_moves_to_the_dead_letters_at_the_cap(
    queues: Queues,
) -> None:
    """M1: a handler that always raises was redelivered for ever (NATS max_deliver -1).
    After TREADLE_QUEUE_MAX_FAILED_DELIVERIES failed deliveries it is a dead letter: kept
    with its last error, and never delivered again."""
    queue = await queues.open()
    assert isinstance(queue, contract.DeadLetters)
    recorder = Recorder(*[Boom(f"poison {n}") for n in range(1, 10)])
    consumer = await queue.consume({"step": recorder})
    try:
        run_id = ids.new_run_id()
        sent = await queue.send(conformance.step_message(run_id))
        for _ in range(CAP):
            await recorder.next()
        (dead,) = await _dead(queue, 1)
        await recorder.assert_quiet()
    finally:
        await consumer.close(grace_seconds=2)
    assert [c.meta.attempt for c in recorder.calls] == [1, 2, 3]
    assert (dead.message_id, dead.kind, dead.run_id) == (sent.message_id, "step", run_id)
    assert dead.deliveries == CAP
    assert "Boom: poison 3" in dead.error


async def test_requeue_delivers_a_dead_letter_again_with_its_counts_from_zero(
    queues: Queues,
) -> None:
    """``treadle dead-letters requeue``: the message comes back under its id, delivery 1."""
    queue = await queues.open()
    recorder = Recorder(*[Boom("poison") for _ in range(CAP)])
    consumer = await queue.consume({"orchestrator": recorder})
    try:
        sent = await queue.send(conformance.orchestrator_message(ids.new_run_id()))
        for _ in range(CAP):
            await recorder.next()
        await _dead(queue, 1)
        await queue.requeue_dead_letter(sent.message_id)
        again = await recorder.next()  # the script is used up: this delivery acks
        await recorder.assert_quiet()
        assert await queue.dead_letters() == []
    finally:
        await consumer.close(grace_seconds=2)
    assert again.meta.message_id == sent.message_id
    assert (again.meta.delivery_count, again.meta.attempt) == (1, 1)


async def test_drop_deletes_a_dead_letter_and_unknown_ids_are_refused(queues: Queues) -> None:
    """``drop`` removes it for good; requeue or drop of an id that is not dead raises."""
    queue = await queues.open()
    recorder = Recorder(*[Boom("poison") for _ in range(CAP)])
    consumer = await queue.consume({"step": recorder})
    try:
        sent = await queue.send(conformance.step_message())
        for _ in range(CAP):
            await recorder.next()
        (dead,) = await _dead(queue, 1)
        await queue.drop_dead_letter(dead.message_id)
        assert await queue.dead_letters() == []
        await recorder.assert_quiet()
    finally:
        await consumer.close(grace_seconds=2)
    with pytest.raises(errors.DeadLetterNotFound):
        await queue.drop_dead_letter(sent.message_id)
    with pytest.raises(errors.DeadLetterNotFound):
        await queue.requeue_dead_letter("msg_01M8R0000000000000000000NO")


# -- NATS: unreadable payloads, kinds not served -------------------------------------------


async def test_an_unreadable_nats_message_is_a_dead_letter_at_once(
    nats_server: NatsServer,
) -> None:
    """M1/M2: a payload that is not a treadle message (a depth-220 input, a forged
    publish) was terminated with a log line only; now it is kept as a dead letter."""
    harness = NatsHarness(nats_server.url)
    queue = await harness.connect(TUNING)
    recorder = Recorder()
    consumer = await queue.consume({"orchestrator": recorder})
    try:
        subject = queue.names.subject("orchestrator", None, ids.new_run_id())
        await queue.js.publish(subject, b"[[[not json", headers={names.MESSAGE_ID: "msg_forged"})
        (dead,) = await _dead(queue, 1)
        await recorder.assert_quiet()
    finally:
        await consumer.close(grace_seconds=2)
        await queue.close()
    assert (dead.message_id, dead.kind, dead.deliveries) == ("msg_forged", "unknown", 1)
    assert "not a treadle message" in dead.error


async def test_an_orchestrator_message_reaching_a_steps_only_worker_is_handed_back(
    nats_server: NatsServer,
) -> None:
    """M1: an orchestrator message on a step subject raised KeyError outside the handler
    guard, took the run's lease and came back every ack-wait. A steps-only worker now
    hands it back to the orchestrator subject, where an orchestrator worker takes it."""
    harness = NatsHarness(nats_server.url)
    steps_only, orchestrator = await harness.connect(TUNING), await harness.connect(TUNING)
    step_recorder, orch_recorder = Recorder(), Recorder()
    steps_consumer = await steps_only.consume({"step": step_recorder})
    try:
        run_id = ids.new_run_id()
        message = conformance.orchestrator_message(run_id)
        wrong = steps_only.names.subject("step", None, run_id)
        await steps_only.js.publish(
            wrong, message.model_dump_json().encode(), headers={names.MESSAGE_ID: "msg_misrouted"}
        )
        # Until an orchestrator worker exists the message waits on its own kind's subject.
        right = steps_only.names.subject("orchestrator", None, run_id)
        assert await _subjects(steps_only, {right: 1}) == {right: 1}
        bucket = await steps_only.js.key_value(steps_only.names.lease_bucket)
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await bucket.get(steps_only.names.lease_key(run_id))  # no lease was taken
        orch_consumer = await orchestrator.consume({"orchestrator": orch_recorder})
        try:
            taken = await orch_recorder.next()
        finally:
            await orch_consumer.close(grace_seconds=2)
        await step_recorder.assert_quiet()
    finally:
        await steps_consumer.close(grace_seconds=2)
        await steps_only.close()
        await orchestrator.close()
    assert step_recorder.calls == []
    assert taken.meta.message_id == "msg_misrouted"
    assert taken.message.run_id == run_id
    assert taken.meta.delivery_count == 1


async def _subjects(queue: Any, expected: dict[str, int]) -> dict[str, int]:
    """The stream's messages by subject, once they are ``expected`` (another task moves
    them) or the wait is over."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        info = await queue.js.stream_info(queue.names.stream, subjects_filter=">")
        found = dict(info.state.subjects or {})
        if found == expected or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.05)  # polling the stream: the hand-back is another task's


# -- local: the same two holes in the dispatcher ---------------------------------------------


def _rewrite_payload(conn: sqlite3.Connection, message_id: str, payload: str) -> None:
    with conn:
        conn.execute(
            "UPDATE queue_messages SET payload = ? WHERE message_id = ?", (payload, message_id)
        )


async def test_an_unreadable_local_message_is_a_dead_letter_at_once(tmp_path: Path) -> None:
    """M1: the local dispatcher parsed outside its guard, so an unreadable payload failed
    every lease for ever; now it is a dead letter on its first delivery."""
    world = await LocalWorld(tmp_path / "world", tuning=TUNING).open()
    recorder = Recorder()
    try:
        sent = await world.queue.send(conformance.step_message())
        await world.local_queue.db.call(
            functools.partial(_rewrite_payload, message_id=sent.message_id, payload="[[[")
        )
        consumer = await world.queue.consume({"step": recorder})
        try:
            (dead,) = await _dead(world.local_queue, 1)
            await recorder.assert_quiet()
        finally:
            await consumer.close(grace_seconds=2)
    finally:
        await world.close()
    assert (dead.message_id, dead.kind, dead.deliveries) == (sent.message_id, "unknown", 1)
    assert "not a treadle message" in dead.error


async def test_a_local_message_of_a_kind_not_served_is_handed_back(tmp_path: Path) -> None:
    """A row filed as a step whose payload is an orchestrator message: the steps-only
    consumer hands it back uncounted; the orchestrator consumer then takes it."""
    world = await LocalWorld(tmp_path / "world", tuning=TUNING).open()
    step_recorder, orch_recorder = Recorder(), Recorder()
    try:
        run_id = ids.new_run_id()
        sent = await world.queue.send(conformance.step_message(run_id))
        forged = conformance.orchestrator_message(run_id).model_dump_json()
        await world.local_queue.db.call(
            functools.partial(_rewrite_payload, message_id=sent.message_id, payload=forged)
        )
        steps_consumer = await world.queue.consume({"step": step_recorder})
        try:
            await step_recorder.assert_quiet()
        finally:
            await steps_consumer.close(grace_seconds=2)
        orch_consumer = await world.queue.consume({"orchestrator": orch_recorder})
        try:
            taken = await orch_recorder.next()
        finally:
            await orch_consumer.close(grace_seconds=2)
    finally:
        await world.close()
    assert step_recorder.calls == []
    assert taken.meta.message_id == sent.message_id
    assert isinstance(taken.message, messages.OrchestratorMessage)
    assert taken.meta.delivery_count == 1
