"""A process the restart test kills with SIGKILL while a delivery is in flight.

Usage: python crash_child.py WORLD_PATH REPORT_FILE. Writes one JSON line per
fact the parent checks, the last one once its delivery is in flight, then
blocks forever.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import UTC, datetime

from treadle.world import events, messages
from treadle.worlds.local import LocalWorld


async def main(world_path: str, report_path: str) -> None:
    report = open(report_path, "a", buffering=1)  # noqa: SIM115 - test child
    world = await LocalWorld(world_path).open()
    run = await world.runs.create(
        workflow_name="wf", input={"n": 1}, deployment_id="dev", spec_version=9
    )
    await world.events.create(
        run.run_id, events.RunStarted(), in_band=True, expected_seq_in_band=1, event_count=1
    )
    ctx = messages.RunContext(spec_version=9, workflow_name="wf")
    step = messages.StepMessage(
        run_id=run.run_id,
        step_id="step_1",
        step_name="s",
        run_context=ctx,
        step_created_at=datetime.now(UTC),
    )
    keyed = await world.queue.send(step, key="step:step_1", delay_seconds=2.0)
    delayed = await world.queue.send(
        messages.OrchestratorMessage(run_id=run.run_id, run_spec_version=9), delay_seconds=3.0
    )
    sent_at = time.time()
    in_flight = await world.queue.send(
        messages.OrchestratorMessage(run_id=run.run_id, run_spec_version=9)
    )
    report.write(
        json.dumps(
            {
                "run_id": run.run_id,
                "keyed": keyed.message_id,
                "delayed": delayed.message_id,
                "in_flight": in_flight.message_id,
                "sent_at": sent_at,
            }
        )
        + "\n"
    )

    async def handler(
        message: messages.OrchestratorMessage | messages.StepMessage, meta: messages.DeliveryMeta
    ) -> messages.HandlerResult:
        report.write(json.dumps({"delivered": meta.message_id, "count": meta.delivery_count}))
        report.write("\n")
        await asyncio.Event().wait()  # in flight until the parent kills us
        return messages.ACK

    await world.queue.consume({"orchestrator": handler, "step": handler})
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
