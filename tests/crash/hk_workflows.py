"""Workflows the hook force-claim and saga kill -9 tests run in a ``treadle worker``.

Each compensation step appends a line to ``TREADLE_TEST_EFFECTS`` and, on its first
attempt with ``TREADLE_TEST_HANG_FIRST_ATTEMPT`` set, hangs so the test can kill the
worker in the middle of compensating. With ``TREADLE_TEST_KILL_BEFORE_VICTIM_WAKE`` set,
the worker kills itself with SIGKILL the first time it is about to wake a force-claim's
victim: right after the claimer's ``hook_created`` (with ``claimed_from``) committed.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from treadle import (
    FatalError,
    HookForceClaimedError,
    Saga,
    SagaCompensated,
    Workflows,
    create_hook,
    step_metadata,
)
from treadle.orchestrator import hookclaims

app = Workflows()


def record(line: str) -> None:
    with Path(os.environ["TREADLE_TEST_EFFECTS"]).open("a") as effects:
        effects.write(line + "\n")
        effects.flush()
        os.fsync(effects.fileno())


@app.step
async def book(what: str) -> str:
    record(f"book {what}")
    return what


@app.step(max_retries=0)
async def refuse(what: str) -> str:
    raise FatalError(f"no {what}")


@app.step(max_retries=3)
async def undo(what: str) -> str:
    attempt = step_metadata().attempt
    record(f"undo {what} start {attempt}")
    if attempt == 1 and what == "hotel" and os.environ.get("TREADLE_TEST_HANG_FIRST_ATTEMPT"):
        await asyncio.sleep(3600)
    record(f"undo {what} done {attempt}")
    return f"undid {what}"


@app.workflow
async def trip(name: str) -> dict[str, object]:
    saga = Saga()
    try:
        async with saga:
            for what in ("flight", "hotel"):
                saga.add(undo, await book(what))
            await refuse("car")
    except SagaCompensated as exc:
        return {"compensated": True, "error": str(exc.error)}
    return {"compensated": False}


@app.step
async def noop(name: str) -> str:
    return name


@app.workflow
async def holder(name: str) -> str:
    try:
        await create_hook(name).payload()
    except HookForceClaimedError as exc:
        return f"claimed by {exc.claimed_by}"
    return "resumed"


@app.workflow
async def taker(name: str) -> str:
    create_hook(name, force=True)
    await noop(name)  # the forced hook is written at this suspension, then the victim woken
    return "took"


if os.environ.get("TREADLE_TEST_KILL_BEFORE_VICTIM_WAKE"):
    _wake = hookclaims.wake_victim

    async def _die(*args: object, **kwargs: object) -> None:
        record("killed before the victim wake")
        os.kill(os.getpid(), signal.SIGKILL)

    hookclaims.wake_victim = _die  # type: ignore[assignment]
