"""The workflow the attribute crash test runs in a ``treadle worker`` subprocess.

``tagged`` sets attributes in workflow code before and after a step; the step sets its
own (its attempt) and, on its first attempt, records that it started (a line in
``TREADLE_TEST_EFFECTS``) and hangs so the test can kill the worker there.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from treadle import Workflows, set_attributes, step_metadata

app = Workflows()


def record(line: str) -> None:
    with Path(os.environ["TREADLE_TEST_EFFECTS"]).open("a") as effects:
        effects.write(line + "\n")
        effects.flush()
        os.fsync(effects.fileno())


@app.step(max_retries=3)
async def work(name: str) -> str:
    attempt = step_metadata().attempt
    await set_attributes({"step_attempt": attempt})
    record(f"{name} start {attempt}")
    if attempt == 1:
        await asyncio.sleep(3600)  # killed here
    return f"{name}:{attempt}"


@app.workflow
async def tagged(name: str) -> str:
    set_attributes({"stage": "working"})
    result = await work(name)
    set_attributes({"stage": "done", "result": result})
    return result
