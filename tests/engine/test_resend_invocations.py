"""The re-send rule runs once per queue delivery, never skipped by another delivery's.

Simulation seed 44 (tests/testing/found_seeds.md): a delivery commits a fan-out's
step creations and its step sends fail after part of them went out; the message's
next delivery, counted above 1, fails in its own re-send; the delivery after it
starts in the same millisecond (a lapsed lease's copy, redelivered at once) in the
same process. Its re-send was keyed by the message id and the start time alone, so
it was taken for a coalesced re-run of the failed delivery and skipped: the steps
never sent were never run and the run never ended. Both Worlds.
"""

from __future__ import annotations

import pytest

from treadle import Workflows, clock, settings
from treadle.orchestrator.delivery import OrchestratorDelivery
from treadle.world import messages

from .faults import FaultyWorld


def _step_send(s: messages.Send) -> bool:
    return isinstance(s.message, messages.StepMessage)


async def test_a_delivery_starting_in_the_same_millisecond_as_a_failed_one_re_sends(
    faulty: FaultyWorld,
) -> None:
    """Three deliveries of one message: the first commits the step's creation and its
    send is lost; the second (counted 2) fails in its re-send; the third (counted 3,
    started in the same millisecond as the second) re-sends the step under its key.
    A coalesced re-run of the third (counted 4, rerun 1) does not send it again."""
    app = Workflows(world=faulty, settings_=settings.load({}, WORKFLOW_MAX_INLINE_STEPS=0,
                    WORKFLOW_ORCHESTRATOR_LINGER_MS=0),
                    worker=False)  # fmt: skip

    @app.step
    async def work() -> str:
        return "w"

    @app.workflow
    async def flow() -> str:
        return await work()

    try:
        run = await app.start(flow)
        rt = app.runtime(faulty)
        record = await run.get()
        wake = messages.OrchestratorMessage(
            run_id=run.run_id, deployment_id=record.deployment_id, run_spec_version=9
        )
        started = clock.now_ms()

        def meta(count: int, *, rerun: int = 0) -> messages.DeliveryMeta:
            return messages.DeliveryMeta(
                message_id="m-seed-44", delivery_count=count + rerun, attempt=count,
                invocation_started_at=started, rerun=rerun,
            )  # fmt: skip

        faulty.queue.drop_sends(1, when=_step_send)
        assert await OrchestratorDelivery(rt, wake, meta(1)).run() == messages.ACK
        (lost,) = faulty.queue.dropped
        faulty.queue.fail_sends(1, when=_step_send)
        with pytest.raises(ConnectionError, match="injected"):
            await OrchestratorDelivery(rt, wake, meta(2)).run()
        assert faulty.queue.send_faults[0].times == 0
        assert await OrchestratorDelivery(rt, wake, meta(3)).run() == messages.ACK
        resent = [s for s in faulty.queue.sent if _step_send(s)]
        assert [s.key for s in resent] == [lost.key], "the third delivery did not re-send"
        assert isinstance(resent[0].message, messages.StepMessage)
        assert resent[0].message.step_resent
        assert await OrchestratorDelivery(rt, wake, meta(3, rerun=1)).run() == messages.ACK
        assert len([s for s in faulty.queue.sent if _step_send(s)]) == 1, "re-run re-sent"
    finally:
        await app.close(grace_seconds=0)
        await faulty.close()
