"""A timed-out attempt's late outcome is refused by the World, however late its writer's
last read was (issue 17 item 5's leftover; ``storagerules.check_outcome_attempt``,
docs/timeouts.md), on both real Worlds (local, and Postgres + NATS).

The timeline: a background step with a timeout runs attempt 1, whose body returns in
time; its delivery re-reads the step's log (``steptimeouts.still_latest``: attempt 1
is still the latest, so it goes on to write), and then its process stalls in the gap
between that read and its write: its event loop is blocked past its queue lease
(``time.sleep``, the only way a live delivery's heartbeat misses) and its write is held
(``FaultyEvents.hold_writes``). The queue gives the message to the next delivery,
which finds attempt 1 open past its timeout, records ``step_retrying`` with
``StepTimedOut``, and starts attempt 2. Only then is attempt 1's write let go: the
World refuses it (``StaleStepOutcome``), the stalled delivery logs it and writes
nothing more, and attempt 2's outcome is the step's. Before the World rule, the
stalled write landed first and attempt 1's result stood.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from treadle import errors, step_metadata
from treadle.world import contract, events

from .audit import assert_sound, cold_outcome, types
from .conftest import MakeApp, OpenWorld
from .faults import FaultyWorld

SHORT_LEASE = contract.QueueTuning(
    lease_seconds=0.9, backoff_base_seconds=0.05, backoff_max_seconds=0.2
)
STEP_TIMEOUT = 2.0
WAIT = 30.0


def _stall_past_lease_and_timeout() -> None:
    # The stall under test: the loop is blocked, so the lease's heartbeat misses; long
    # enough that the step's timeout has passed too when the redelivery judges attempt 1.
    time.sleep(STEP_TIMEOUT + 1.0)


def _attempt_1_completion(event: events.Event) -> bool:
    return isinstance(event, events.StepCompleted) and event.attempt == 1


async def test_a_timed_out_attempts_late_outcome_is_refused_after_the_next_attempt_started(
    open_world: OpenWorld, make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="treadle.orchestrator.steps")
    world = FaultyWorld(await open_world(SHORT_LEASE))
    app = make_app(world=world, WORKFLOW_MAX_INLINE_STEPS=0)  # a background step
    release_write = asyncio.Event()
    attempt_2_may_finish = asyncio.Event()
    world.events.hold_writes(_attempt_1_completion, release_write, _stall_past_lease_and_timeout)
    attempts: list[int] = []

    @app.step(timeout=f"{STEP_TIMEOUT}s", max_retries=2)
    async def fetch() -> str:
        attempt = step_metadata().attempt
        attempts.append(attempt)
        if attempt == 2:
            await attempt_2_may_finish.wait()  # its outcome comes after the stale write
        return f"from {attempt}"

    @app.workflow
    async def flow() -> str:
        return await fetch()

    run = await app.start(flow)

    async def until(check: object, what: str) -> list[events.LoggedEvent]:
        deadline = time.monotonic() + WAIT
        while True:
            log = await run.events()
            if check(log):  # type: ignore[operator]
                return list(log)
            assert time.monotonic() < deadline, f"never saw {what}: {types(log)}"
            await asyncio.sleep(0.05)  # the engine's progress, seen through the World

    def attempt_2_started(log: list[events.LoggedEvent]) -> bool:
        return any(isinstance(e.event, events.StepStarted) and e.event.attempt == 2 for e in log)

    log = await until(attempt_2_started, "attempt 2's start")
    (lapse,) = [e.event for e in log if isinstance(e.event, events.StepRetrying)]
    assert (lapse.attempt, lapse.error.type) == (1, "StepTimedOut")
    assert not [e for e in log if e.type == "step_completed"]  # the stale write is held

    release_write.set()  # the stalled process resumes and writes attempt 1's outcome
    deadline = time.monotonic() + WAIT
    while not world.events.held_answers:
        assert time.monotonic() < deadline, "the held write never reached the World"
        await asyncio.sleep(0.02)  # the released writer's progress
    ((held, refusal),) = world.events.held_answers
    assert isinstance(held, events.StepCompleted)
    assert held.result == "from 1"
    assert isinstance(refusal, errors.StaleStepOutcome), refusal
    assert (refusal.attempt, refusal.latest_attempt, refusal.event_type) == (
        1,
        2,
        "step_completed",
    )
    deadline = time.monotonic() + WAIT
    while "attempt 2 started after it" not in caplog.text:
        assert time.monotonic() < deadline, "the stalled delivery never logged its refusal"
        await asyncio.sleep(0.02)

    attempt_2_may_finish.set()
    assert await run.result(timeout=WAIT) == "from 2"
    log = await assert_sound(run)
    completions = [e.event for e in log if isinstance(e.event, events.StepCompleted)]
    assert [(c.attempt, c.result) for c in completions] == [(2, "from 2")]
    assert [e.event.attempt for e in log if isinstance(e.event, events.StepStarted)] == [1, 2]
    assert attempts == [1, 2]
    assert cold_outcome(flow, log) == ("completed", "from 2")
