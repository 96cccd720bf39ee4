"""kill -9 the process holding a local World; a new process loses nothing.

Seed 003 "First-party Worlds" (world-local restart) and EDGE-CASES I1: queued,
delayed and in-flight messages and dedupe keys are rows, not memory.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from treadle.world import messages
from treadle.worlds.local import LocalWorld

CHILD = Path(__file__).with_name("crash_child.py")


async def _wait_for_lines(path: Path, count: int, proc: subprocess.Popen[bytes]) -> list[dict]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the child died before it was killed"
        if path.exists():
            lines = [json.loads(line) for line in path.read_text().splitlines() if line]
            if len(lines) >= count:
                return lines
        await asyncio.sleep(0.02)  # polling another process's file: no event to await
    raise AssertionError(f"child wrote {path.read_text() if path.exists() else 'nothing'}")


async def test_sigkill_mid_delivery_loses_nothing(tmp_path: Path) -> None:
    """In-flight comes back counted above 1; delayed keeps its time; keys and events stay."""
    world_path, report = tmp_path / "world", tmp_path / "report.jsonl"
    proc = subprocess.Popen([sys.executable, str(CHILD), str(world_path), str(report)])
    try:
        facts, delivered = await _wait_for_lines(report, 2, proc)
        assert delivered == {"delivered": facts["in_flight"], "count": 1}
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    got: asyncio.Queue[tuple[str, messages.DeliveryMeta, float]] = asyncio.Queue()

    async def handler(
        message: messages.OrchestratorMessage | messages.StepMessage, meta: messages.DeliveryMeta
    ) -> messages.HandlerResult:
        await got.put((message.kind, meta, time.time()))
        return messages.ACK

    async with LocalWorld(world_path) as world:
        run = await world.runs.get(facts["run_id"])
        assert (run.seq, run.seq_in_band, run.status) == (2, 2, "running")
        step = messages.StepMessage(
            run_id=run.run_id,
            step_id="step_1",
            step_name="s",
            step_created_at=datetime.now(UTC),
            run_context=messages.RunContext(spec_version=9, workflow_name="wf"),
        )
        resent = await world.queue.send(step, key="step:step_1")
        assert resent == messages.SendResult(message_id=facts["keyed"], deduplicated=True)

        consumer = await world.queue.consume({"orchestrator": handler, "step": handler})
        seen = {}
        for _ in range(3):
            _, meta, at = await asyncio.wait_for(got.get(), timeout=10)
            seen[meta.message_id] = (meta.delivery_count, at)
        await consumer.close()

    assert set(seen) == {facts["in_flight"], facts["delayed"], facts["keyed"]}
    assert seen[facts["in_flight"]][0] == 2, "the in-flight delivery returns counted above 1"
    assert seen[facts["delayed"]][0] == 1
    assert seen[facts["keyed"]][0] == 1
    assert seen[facts["delayed"]][1] >= facts["sent_at"] + 3.0 - 0.01, "never before its delay"
    assert seen[facts["keyed"]][1] >= facts["sent_at"] + 2.0 - 0.05
    assert got.empty()
