"""Workflows the limit crash tests run in ``treadle worker`` subprocesses (issue 17 item 4).

``guarded(name, key)`` holds one slot of its key (``max=1``) while its one step runs; the
step appends ``<name> in <attempt> <pid>`` and ``<name> out <attempt>`` to the file named
by ``TREADLE_TEST_EFFECTS``. With ``TREADLE_TEST_HANG_FIRST_ATTEMPT`` set, a first attempt
hangs (the test kills the worker inside it); ``TREADLE_TEST_HOLD_SECONDS`` keeps every
body inside for that long, so overlapping bodies would show in the file.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from treadle import Limit, Workflows, step_metadata

app = Workflows()


def record(line: str) -> None:
    with Path(os.environ["TREADLE_TEST_EFFECTS"]).open("a") as effects:
        effects.write(line + "\n")
        effects.flush()
        os.fsync(effects.fileno())


@app.step(max_retries=3)
async def guarded_body(name: str) -> str:
    attempt = step_metadata().attempt
    record(f"{name} in {attempt} {os.getpid()}")
    if attempt == 1 and os.environ.get("TREADLE_TEST_HANG_FIRST_ATTEMPT"):
        await asyncio.sleep(3600)
    await asyncio.sleep(float(os.environ.get("TREADLE_TEST_HOLD_SECONDS", "0")))
    record(f"{name} out {attempt}")
    return f"{name}:{attempt}"


@app.workflow(concurrency=Limit(key=lambda name, key: key, max=1))
async def guarded(name: str, key: str) -> str:
    return await guarded_body(name)
