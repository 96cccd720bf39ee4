"""A background step's stale delivery runs no body (both Worlds).

Simulation seed 522 (tests/testing/found_seeds.md, "After the fixes"): a step's first,
plain delivery stalled inside its out-of-band ``step_started`` past its lease; its
redeliveries started and retried attempts 1 and 2; the stale write then landed as
``step_started attempt 1`` and its body ran, burning an attempt. The World now refuses
that start (``StaleStepStart``), and the handler acknowledges with no body and no write;
a delivery whose lease lapsed during its start write runs no body either.
"""

from __future__ import annotations

import asyncio
from typing import Any

from treadle import RetryableError
from treadle.orchestrator import steps as step_handler
from treadle.world import events, messages, records

from .conftest import MakeApp
from .faults import FaultyWorld


async def _step_with_message(world: FaultyWorld, step_id: str) -> tuple[str, messages.StepMessage]:
    record = await world.runs.create(
        workflow_name="none", input=None, deployment_id="local", spec_version=9
    )
    created = await world.events.create(
        record.run_id, events.StepCreated(correlation_id=step_id, step_name="work"),
        in_band=False,
    )  # fmt: skip
    message = messages.StepMessage(
        run_id=record.run_id, deployment_id="local", step_id=step_id, step_name="work",
        step_created_at=created.event.created_at,
        run_context=messages.RunContext(spec_version=9, deployment_id="local",
                                        workflow_name="none"),
    )  # fmt: skip
    return record.run_id, message


def _plain_meta(message_id: str, lease_lost: asyncio.Event | None = None) -> messages.DeliveryMeta:
    return messages.DeliveryMeta(
        message_id=message_id,
        delivery_count=1,
        attempt=1,
        invocation_started_at=0,
        lease_lost=lease_lost,
    )


async def test_a_plain_delivery_whose_start_is_stale_runs_no_body(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Seed 522's timeline: redeliveries started and retried attempts 1 and 2; the plain
    first delivery's start then lands as attempt 1. It is refused, the body does not run,
    nothing is written and the delivery is acknowledged."""
    app = make_app(world=faulty)
    ran: list[str] = []

    @app.step(max_retries=3)
    async def work() -> str:
        ran.append("work")
        return "ran"

    run_id, message = await _step_with_message(faulty, "step_stale")
    forward = faulty.events.create
    before: list[events.LoggedEvent] = []

    async def stalled_start(run: str, event: events.Event, **kw: Any) -> records.EventResult:
        # The handler read the log (no start yet) and stalls in its start write; meanwhile
        # the redeliveries start and retry attempts 1 and 2; then the stale write lands.
        if isinstance(event, events.StepStarted) and not before:
            for attempt in (1, 2):
                await forward(
                    run,
                    events.StepStarted(
                        correlation_id="step_stale", step_name="work", attempt=attempt
                    ),
                    in_band=False,
                )
                await forward(
                    run,
                    events.StepRetrying(
                        correlation_id="step_stale", step_name="work", attempt=attempt,
                        error=events.ErrorInfo(message="try again", type="RetryableError"),
                    ),
                    in_band=False,
                )  # fmt: skip
            before.extend((await faulty.events.list(run_id)).events)
        return await forward(run, event, **kw)

    faulty.events.create = stalled_start  # type: ignore[method-assign]
    answer = await step_handler.handle_step_message(
        app.runtime(faulty), message, _plain_meta("m-stale")
    )
    assert answer == messages.ACK
    assert ran == []
    assert before
    assert list((await faulty.events.list(run_id)).events) == before
    step = await faulty.steps.get(run_id, "step_stale")
    assert (step.status, step.attempt) == ("retrying", 2)


async def test_a_delivery_that_lost_its_lease_during_its_start_runs_no_body(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """A retryable step's delivery whose lease lapsed by the time its start write returned
    runs no body (a redelivery re-runs the step and this body could overlap it): the start
    is in the log, no outcome is written, and the delivery is acknowledged."""
    app = make_app(world=faulty)
    ran: list[str] = []

    @app.step(max_retries=3)
    async def work() -> str:
        ran.append("work")
        raise RetryableError("never reached")

    run_id, message = await _step_with_message(faulty, "step_lapsed")
    lapsed = asyncio.Event()
    lapsed.set()
    answer = await step_handler.handle_step_message(
        app.runtime(faulty), message, _plain_meta("m-lapsed", lapsed)
    )
    assert answer == messages.ACK
    assert ran == []
    log = [e.event for e in (await faulty.events.list(run_id)).events]
    assert [e.type for e in log] == ["run_created", "step_created", "step_started"]
    assert isinstance(log[-1], events.StepStarted) and log[-1].attempt == 1
