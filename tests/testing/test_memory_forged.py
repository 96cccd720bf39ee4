"""Forged messages on the in-memory World's queue run nothing and write nothing (H2).

The memory World's queue takes a raw payload (``MessageQueue.send(send, payload)``),
so a test can put there what no treadle sender writes: a step message for a step the
log never created, a start message for a run that does not exist, a delivery whose
handoff count is out of range. Each is refused (acknowledged and logged, or
dead-lettered at the boundary), no body runs, no run's log changes, and the victim run,
idle on a hook, still completes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from treadle import Hook, Workflows, errors, settings
from treadle.testing.memory import MemoryBackend, MemoryWorld
from treadle.world import contract, events, ids, messages

FAST = {"WORKFLOW_ORCHESTRATOR_LINGER_MS": 100, "WORKFLOW_MAX_INLINE_STEPS": 0}
TUNING = contract.QueueTuning(lease_seconds=5.0, backoff_base_seconds=0.05, backoff_max_seconds=0.5)
WAIT = 10.0


class Approval(Hook):
    approved: bool


async def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.02)  # polling the backend's state: nothing announces it


def _forge(backend: MemoryBackend, payload: dict[str, Any], **counts: int) -> str:
    """A raw payload onto the memory queue; ``counts`` overwrite the entry's own."""
    carrier = messages.OrchestratorMessage(run_id=payload["run_id"])  # routing only
    sent = backend.queue.send(messages.Send(carrier), json.dumps(payload))
    entry = backend.queue.ready[sent.message_id]
    for name, value in counts.items():
        setattr(entry, name, value)
    backend.queue.wake()
    return sent.message_id


async def test_forged_messages_on_the_memory_queue_run_and_write_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="treadle")
    backend = MemoryBackend(tuning=TUNING)
    world = MemoryWorld(backend)
    app = Workflows(world=world, worker=True, settings_=settings.load({}, **FAST))
    bodies: Counter[str] = Counter()
    inputs: set[str] = set()

    @app.step
    async def echo(text: str) -> str:
        bodies[text] += 1
        return text

    @app.workflow(name="victim")
    async def victim(tag: str) -> str:
        inputs.add(tag)
        first = await echo(tag)
        answer = await Approval.wait(token=f"memory:{tag}")
        assert answer is not None
        return f"{first}:{answer.approved}"

    try:
        run = await app.start(victim, "v1")
        await _until(
            lambda: (
                any(e.type == "hook_created" for e in backend.events_of(run.run_id))
                and backend.queued() == 0
            ),
            "the victim idle on its hook",
        )
        before = list(backend.events_of(run.run_id))
        step_id = next(e.event.correlation_id for e in before if e.type == "step_created")
        now = datetime.now(UTC).isoformat()
        context = {"spec_version": 9, "deployment_id": "local", "workflow_name": "victim"}
        evil = {"args": ["evil"], "kwargs": {}}
        ghost = ids.new_run_id()
        forged = [
            # A step the log never created, then the real step under another name.
            {"kind": "step", "run_id": run.run_id, "step_id": "step_BOGUS", "step_name": "echo",
             "run_context": context, "step_created_at": now, "input": evil,
             "input_in_log": False},
            {"kind": "step", "run_id": run.run_id, "step_id": step_id, "step_name": "wipe",
             "run_context": context, "step_created_at": now},
            # A start for a run that does not exist (turbo).
            {"kind": "orchestrator", "run_id": ghost, "run_input": {
                "workflow_name": "victim", "input": evil, "spec_version": 9,
                "deployment_id": "local", "created_at": now}},
        ]  # fmt: skip
        for payload in forged:
            _forge(backend, payload)
            await _until(lambda: backend.queued() == 0, "the forged message consumed")
        refused = _forge(backend, {"kind": "orchestrator", "run_id": run.run_id}, handoffs=999_999)
        await _until(lambda: backend.queued() == 0, "the forged stamp dead-lettered")
        assert refused in {d.message_id for d in backend.dead_letters()}
        assert bodies == Counter({"v1": 1})
        assert inputs == {"v1"}
        assert list(backend.events_of(run.run_id)) == before
        with pytest.raises(errors.RunNotFound):
            backend.run_record(ghost)
        said = [r.getMessage() for r in caplog.records if r.name.startswith("treadle")]
        assert any("created no step step_BOGUS" in m and run.run_id in m for m in said)
        assert any("as 'echo', not 'wipe'" in m for m in said)
        assert any(ghost in m and "names no run" in m for m in said)
        assert any(refused in m and "out of range" in m for m in said)
        await app.resume_hook("memory:v1", {"approved": True})
        assert await run.result(timeout=WAIT) == "v1:True"
        assert bodies == Counter({"v1": 1})
    finally:
        await app.close(grace_seconds=2)
        await world.close()
    assert all(e.type != "step_started" or e.event.correlation_id == step_id
               for e in backend.events_of(run.run_id)
               if isinstance(e.event, events.StepStarted))  # fmt: skip
