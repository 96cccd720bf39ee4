"""Helpers shared by the optimistic-start tests (test_optimistic_starts.py,
test_optimistic_background_start.py): a gate holding matched World writes, and
predicates over the events written."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from treadle import Hook
from treadle.world import events

from .faults import CURRENT, FaultyWorld

# A held write is released by its event, or after this bound (the test then fails).
HOLD_BOUND_SECONDS = 15.0
# Run-ahead (issue 15 item 1, branch ra) starts inline bodies before their starts too;
# these tests isolate turbo's optimistic starts (a setting a build lacks is ignored).
TURBO_ONLY: dict[str, Any] = {"WORKFLOW_RUN_AHEAD_DEPTH": 0}


class Ping(Hook):
    n: int


class Gate:
    """Holds the World writes that match until ``release`` is set (or the bound runs out,
    recorded in ``timed_out``); ``held`` names what was held."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.held: list[str] = []
        self.timed_out: list[str] = []


def hold_writes(world: FaultyWorld, when: Callable[[events.Event], bool]) -> Gate:
    """Hold every write (one event, or a batch with one) that matches ``when``."""
    gate = Gate()
    inner, inner_batch = world.events.create, world.events.create_batch

    async def hold(event: events.Event) -> None:
        gate.held.append(event.type)
        try:
            await asyncio.wait_for(gate.release.wait(), HOLD_BOUND_SECONDS)
        except TimeoutError:
            gate.timed_out.append(event.type)

    async def create(run_id: str, event: events.Event, **kw: Any) -> Any:
        if when(event):
            await hold(event)
        return await inner(run_id, event, **kw)

    async def create_batch(run_id: str, batch: list[events.Event], **kw: Any) -> Any:
        for event in batch:
            if when(event):
                await hold(event)
                break
        return await inner_batch(run_id, batch, **kw)

    world.events.create = create  # type: ignore[method-assign]
    world.events.create_batch = create_batch  # type: ignore[method-assign]
    return gate


async def own_start_in_log(world: FaultyWorld, name: str) -> bool:
    """Read from inside a step body: is that step's step_started in the log yet?"""
    meta = CURRENT.get()
    assert meta is not None
    run_id = meta.message.run_id
    page = await world.inner.events.list(run_id)  # not counted as a delivery's load
    return any(
        isinstance(e.event, events.StepStarted) and e.event.step_name == name for e in page.events
    )


def is_run_started(event: events.Event) -> bool:
    return event.type == "run_started"


def is_inline_start(name: str) -> Callable[[events.Event], bool]:
    return lambda e: isinstance(e, events.StepStarted) and e.step_name == name and e.inline
