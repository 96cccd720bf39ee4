"""Stamps at every send site (seed 003 "Stamps at every send site", "Resolving a delivery's
spec"; issue 12 item 1): every message this runtime sends for a run names the run's own
version, and routing reads the run row only for an unstamped message.

The run goes through every send site a user reaches: the start (``run_input``), inline
and background steps (``run_context``), a retry, the step handler's wakes, a timer, a
hook resume's wake, ``wake_up``'s wake and a cancel, on both Worlds (local and
postgres+nats). Each message tapped on the queue must carry the run's version.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from treadle import Hook, RetryableError, sleep, step_metadata
from treadle.errors import HookNotFound
from treadle.orchestrator.worker import Worker
from treadle.world import contract, messages, records, specversions

from .conftest import BOTH_FORMATS, MakeApp
from .faults import FaultyWorld


class Approval(Hook):
    approved: bool


async def _until_logged(
    app: Any, run_id: str, type_: str, count: int = 1, timeout: float = 15
) -> None:
    """Until the run's log holds ``count`` events of ``type_`` (another task's progress)."""
    deadline = time.monotonic() + timeout
    while [e.type for e in await app.get_run(run_id).events()].count(type_) < count:
        assert time.monotonic() < deadline, f"run {run_id} never logged {type_}"
        await asyncio.sleep(0.02)


async def _until_hook(world: contract.World, token: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            await world.hooks.get_by_token(token)
            return
        except HookNotFound:
            assert time.monotonic() < deadline, f"hook {token} never created"
            await asyncio.sleep(0.02)


def _site(send: messages.Send) -> str:
    """Which send site a message came from, as far as its payload says."""
    message = send.message
    if isinstance(message, messages.StepMessage):
        return "step"
    if message.run_input is not None:
        return "start"
    if message.wait_continuation is not None:
        return "timer"
    return "wake"


def _stamps(world: FaultyWorld, run: records.RunRecord) -> dict[str, set[int | None]]:
    seen: dict[str, set[int | None]] = {}
    for send in world.queue.sent:
        if send.message.run_id == run.run_id:
            seen.setdefault(_site(send), set()).add(send.message.spec_version)
    return seen


@BOTH_FORMATS
async def test_every_message_of_a_run_carries_the_runs_version(
    make_app: MakeApp, faulty: FaultyWorld, spec_version: int
) -> None:
    """Issue 12 item 1: a run's start, step messages (background steps and a retry), step
    wakes, timer, hook wake, wake-up wake; and a second run's cancel. Every one is stamped
    with the run's version, none unstamped, none with another: spec 9 on both Worlds,
    spec 8 on the local one."""
    app = make_app(world=faulty, WORKFLOW_MAX_INLINE_STEPS=2)

    @app.step
    async def add(x: int) -> int:
        return x + 1

    @app.step
    async def flaky(x: int) -> int:
        if step_metadata().attempt == 1:
            raise RetryableError("busy", retry_after=0.05)
        return x

    @app.workflow
    async def stamped(token: str) -> int:
        parts = await asyncio.gather(*(add(i) for i in range(4)))  # 2 inline, 2 background
        total = await flaky(sum(parts))
        await sleep("0.2s")
        answer = await Approval.wait(token=token)
        await sleep("1h")  # ended by wake_up
        return total + (1 if answer is not None and answer.approved else 0)

    @app.workflow
    async def napping() -> str:
        await sleep("1h")
        return "never"

    world = await app.world()
    run = await app.start(stamped, "stamp-1")
    await _until_hook(world, "stamp-1")
    await app.resume_hook("stamp-1", {"approved": True})
    await _until_logged(app, run.run_id, "wait_created", count=2)  # the 1 h sleep
    assert await run.wake_up() == 1
    assert await run.result(timeout=20) == 11

    other = await app.start(napping)
    await _until_logged(app, other.run_id, "wait_created")
    await other.cancel()

    record = await run.get()
    seen = _stamps(faulty, record)
    assert set(seen) == {"start", "step", "timer", "wake"}, seen
    assert record.spec_version == spec_version
    assert all(stamps == {spec_version} for stamps in seen.values()), seen
    assert {s for v in _stamps(faulty, await other.get()).values() for s in v} == {spec_version}


class _CountingRuns:
    """The World's runs, counting ``get`` (the routing's one row read)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gets = 0

    async def get(self, run_id: str) -> records.RunRecord:
        self.gets += 1
        return await self.inner.get(run_id)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("spec_version", [8, 9])
async def test_routing_reads_the_run_row_only_for_an_unstamped_message(
    make_app: MakeApp, faulty: FaultyWorld, spec_version: int
) -> None:
    """Seed 003 "Resolving a delivery's spec": a stamped message (``run_input``,
    ``run_spec_version``) routes by its stamp with no read; an unstamped one reads the run
    once and routes by the row. A hint of 7 (a version this build does not know) goes to
    the spec 9 delivery, which loads the run before deciding."""
    app = make_app(world=faulty)  # no worker: app.world() is never called
    run = await faulty.inner.runs.create(
        workflow_name="wf", input=None, deployment_id="local", spec_version=spec_version
    )
    counting = _CountingRuns(faulty.runs)
    faulty.runs = counting  # type: ignore[assignment]
    worker = Worker(app.runtime(faulty))  # type: ignore[arg-type]
    family = specversions.orchestrator_for(spec_version)
    start = messages.OrchestratorMessage(
        run_id=run.run_id,
        run_input=messages.RunInput(
            workflow_name="wf", spec_version=spec_version, created_at=run.created_at
        ),
    )
    hinted = messages.OrchestratorMessage(run_id=run.run_id, run_spec_version=spec_version)
    assert await worker.family(start) is family
    assert await worker.family(hinted) is family
    assert counting.gets == 0
    unstamped = messages.OrchestratorMessage(run_id=run.run_id)
    assert await worker.family(unstamped) is family
    assert counting.gets == 1
    unknown = messages.OrchestratorMessage(run_id=run.run_id, run_spec_version=7)
    assert await worker.family(unknown) is specversions.Family.SPEC9
    assert counting.gets == 1
