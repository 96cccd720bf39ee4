"""Workflows seed 000's crash tests run in a ``treadle worker`` subprocess and in-process.

Each step appends a line to the file named by ``TREADLE_TEST_EFFECTS`` (its side
effect, which the test counts): ``<name> start <attempt>`` then ``<name> done
<attempt>``. With ``TREADLE_TEST_HANG_FIRST_ATTEMPT`` set, attempt 1 hangs after
its start line, so the test can kill the worker inside the body; with
``TREADLE_TEST_POISON`` set, every attempt after the first fails with a
``FatalError`` (a poison step, failed step-level). In the test process, an
``asyncio.Event`` in ``GATES[name]`` holds every attempt after the first until it is
set. ``register(app)`` declares them on an app (the test process's); ``app`` is the
subprocess worker's.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from treadle import FatalError, Hook, StepFailed, Workflows, step_metadata

# Test-process gates: attempts after the first of step ``name`` wait for GATES[name].
GATES: dict[str, asyncio.Event] = {}


class Go(Hook):
    go: bool


def record(line: str) -> None:
    with Path(os.environ["TREADLE_TEST_EFFECTS"]).open("a") as effects:
        effects.write(line + "\n")
        effects.flush()
        os.fsync(effects.fileno())


async def _body(name: str) -> str:
    attempt = step_metadata().attempt
    record(f"{name} start {attempt}")
    if attempt == 1 and os.environ.get("TREADLE_TEST_HANG_FIRST_ATTEMPT"):
        await asyncio.sleep(3600)
    gate = GATES.get(name)
    if attempt > 1 and gate is not None:
        await gate.wait()
    if attempt > 1 and os.environ.get("TREADLE_TEST_POISON"):
        record(f"{name} poisoned {attempt}")
        raise FatalError(f"poison step {name}")
    record(f"{name} done {attempt}")
    return f"{name}:{attempt}"


def register(app: Workflows) -> None:
    @app.step
    async def long_body(name: str) -> str:
        return await _body(name)

    @app.step(max_retries=0)
    async def at_most_once(name: str) -> str:
        return await _body(name)

    @app.workflow
    async def owned_at_most_once(name: str) -> str:
        """One inline ``max_retries=0`` step: never run twice, even by owned recovery."""
        try:
            return await at_most_once(name)
        except StepFailed as exc:
            return f"failed: {exc.error_type}"

    @app.workflow
    async def owned(name: str) -> str:
        """One inline step (the first suspension runs it lazily inline, owned)."""
        return await long_body(name)

    @app.workflow
    async def owned_with_hook(name: str) -> str:
        """An inline step beside a hook: resuming the hook wakes the run mid-step."""
        try:
            result, _ = await asyncio.gather(long_body(name), Go.wait(token=f"go:{name}"))
        except StepFailed as exc:
            return f"caught {exc.error_type}: {exc.error_message}"
        return str(result)


app = Workflows()
register(app)
