"""Helpers the storage conformance suites share: opening a World, writing, reading.

Used by ``storage`` and ``storage_views``; every helper goes through the World
contract only, so the suites run unchanged against any World.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from pydantic import JsonValue

from treadle.world import constants, contract, events, records
from treadle.world.conformance.harness import WorldHarness

SPEC_VERSION = constants.SPEC_VERSION_SINGLE_ORCHESTRATOR
DEPLOYMENT = "dpl_conformance"
OCCURRED_AT = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
BOOM = events.ErrorInfo(message="boom")
WAIT_SECONDS = 10.0
QUIET_SECONDS = 0.3


@contextlib.asynccontextmanager
async def opened(harness: WorldHarness) -> AsyncIterator[contract.World]:
    """Open the World under test and always close it."""
    world = await harness.open()
    try:
        yield world
    finally:
        await world.close()


def unique(prefix: str) -> str:
    """A name no other test uses, for Worlds whose storage outlives one test."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


async def new_run(
    world: contract.World,
    *,
    workflow_name: str = "wf",
    input: JsonValue = None,
    deployment_id: str = DEPLOYMENT,
    run_id: str | None = None,
) -> records.RunRecord:
    return await world.runs.create(
        workflow_name=workflow_name,
        input=input,
        deployment_id=deployment_id,
        spec_version=SPEC_VERSION,
        run_id=run_id,
    )


async def in_band(
    world: contract.World,
    run_id: str,
    event: events.Event,
    *,
    occurred_at: datetime | None = None,
    idempotency_key: str | None = None,
) -> records.EventResult:
    """An in-band write by an orchestrator holding the run's current counts."""
    run = await world.runs.get(run_id)
    return await world.events.create(
        run_id,
        event,
        in_band=True,
        expected_seq_in_band=run.seq_in_band,
        event_count=run.seq,
        occurred_at=occurred_at,
        idempotency_key=idempotency_key,
    )


async def out_of_band(
    world: contract.World,
    run_id: str,
    event: events.Event,
    *,
    occurred_at: datetime | None = None,
    idempotency_key: str | None = None,
) -> records.EventResult:
    return await world.events.create(
        run_id, event, in_band=False, occurred_at=occurred_at, idempotency_key=idempotency_key
    )


async def started_run(world: contract.World, *, workflow_name: str = "wf") -> str:
    """A run with run_started written in-band at slot 2 (seq 2, seq_in_band 2)."""
    run = await new_run(world, workflow_name=workflow_name)
    await in_band(world, run.run_id, events.RunStarted())
    return run.run_id


async def full_log(
    world: contract.World, run_id: str, *, limit: int = 1000
) -> list[events.LoggedEvent]:
    """Every event of the run, following the cursor until ``has_more`` is False."""
    logged: list[events.LoggedEvent] = []
    after = 0
    for _ in range(1000):
        page = await world.events.list(run_id, after_slot=after, limit=limit)
        logged.extend(page.events)
        if not page.has_more:
            return logged
        after = page.cursor
    raise AssertionError("events.list never reached has_more=False")


async def log_and_snapshot(
    world: contract.World, run_id: str
) -> tuple[list[events.LoggedEvent], events.Snapshot]:
    page = await world.events.list(run_id)
    assert not page.has_more
    return list(page.events), page.snapshot


def stored(event: events.LoggedEvent) -> tuple[str, int, bool, events.Event]:
    """What the log pins about an event, leaving out how its time is rendered."""
    return event.run_id, event.slot, event.in_band, event.event


def attr(key: str) -> events.AttrSet:
    return events.AttrSet(key=key, value=key)


def inline_start(step_id: str, attempt: int = 1) -> events.StepStarted:
    """An inline step's start; the first one creates the step and carries its input."""
    first = attempt == 1
    return events.StepStarted(
        correlation_id=step_id,
        step_name="add",
        attempt=attempt,
        inline=first,
        input=[1, 2] if first else None,
    )


def step_created(step_id: str) -> events.StepCreated:
    return events.StepCreated(correlation_id=step_id, step_name="fetch", input={"url": "u"})


def step_completed(step_id: str, step_name: str = "add") -> events.StepCompleted:
    return events.StepCompleted(correlation_id=step_id, step_name=step_name, result=3)


def step_failed(step_id: str, attempt: int = 1) -> events.StepFailed:
    return events.StepFailed(correlation_id=step_id, step_name="fetch", attempt=attempt, error=BOOM)


def wait_created(wait_id: str) -> events.WaitCreated:
    return events.WaitCreated(correlation_id=wait_id, resume_at=datetime(2030, 1, 1, tzinfo=UTC))


def hook_created(hook_id: str, token: str) -> events.HookCreated:
    return events.HookCreated(correlation_id=hook_id, token=token)


ENDINGS = ["completed", "failed", "cancelled"]


async def end_run(world: contract.World, run_id: str, ending: str) -> None:
    """End the run as its orchestrator (completed, failed) or as cancel() (cancelled)."""
    if ending == "completed":
        await in_band(world, run_id, events.RunCompleted(output="done"))
    elif ending == "failed":
        await in_band(world, run_id, events.RunFailed(error=BOOM))
    else:
        await out_of_band(world, run_id, events.RunCancelled(reason="test"))
