"""A background step's stale delivery runs no body (both Worlds).

Simulation seed 522 (tests/testing/found_seeds.md, "After the fixes"): a step's first,
plain delivery stalled inside its out-of-band ``step_started`` past its lease; its
redeliveries started and retried attempts 1 and 2; the stale write then landed as
``step_started attempt 1`` and its body ran, burning an attempt. The World now refuses
that start (``StaleStepStart``), and the handler acknowledges with no body and no write;
a delivery whose lease lapsed during its start write runs no body either, and one told
its lease lapsed before its start writes nothing (seed 58: such starts spent attempts).
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
    forward = faulty.events.create

    async def lapsing_start(run: str, event: events.Event, **kw: Any) -> records.EventResult:
        # The start write is in flight when the lease lapses; the write still commits.
        result = await forward(run, event, **kw)
        if isinstance(event, events.StepStarted):
            lapsed.set()
        return result

    faulty.events.create = lapsing_start  # type: ignore[method-assign]
    answer = await step_handler.handle_step_message(
        app.runtime(faulty), message, _plain_meta("m-lapsed", lapsed)
    )
    assert answer == messages.ACK
    assert ran == []
    log = [e.event for e in (await faulty.events.list(run_id)).events]
    assert [e.type for e in log] == ["run_created", "step_created", "step_started"]
    assert isinstance(log[-1], events.StepStarted) and log[-1].attempt == 1


async def test_a_delivery_told_its_lease_lapsed_before_its_start_writes_nothing(
    make_app: MakeApp, faulty: FaultyWorld
) -> None:
    """Simulation seed 58: the deliveries of a max_retries=1 step were each told their lease
    lapsed (their process stalled) before the handler wrote its start; each wrote
    step_started and ran no body, so two of them spent both attempts and the live
    redelivery failed the step as StepAttemptsExhausted, never run. A delivery told
    before its start writes nothing (F3) and runs no body; the live redelivery then runs
    attempt 1."""
    app = make_app(world=faulty)
    ran: list[int] = []

    @app.step(max_retries=1)
    async def work() -> str:
        ran.append(len(ran) + 1)
        return "ran"

    run_id, message = await _step_with_message(faulty, "step_told")
    rt = app.runtime(faulty)
    told = asyncio.Event()
    told.set()
    for n in (1, 2):
        answer = await step_handler.handle_step_message(
            rt, message, _plain_meta(f"m-told-{n}", told)
        )
        assert isinstance(answer, messages.Redeliver)  # dropped: another delivery holds it
    assert ran == []
    assert [e.type for e in (await faulty.events.list(run_id)).events] == [
        "run_created",
        "step_created",
    ]
    live = messages.DeliveryMeta(
        message_id="m-told-3", delivery_count=3, attempt=3, invocation_started_at=0
    )
    assert await step_handler.handle_step_message(rt, message, live) == messages.ACK
    assert ran == [1]
    log = [e.event for e in (await faulty.events.list(run_id)).events]
    assert [e.type for e in log][-2:] == ["step_started", "step_completed"]
    assert isinstance(log[-2], events.StepStarted) and log[-2].attempt == 1
