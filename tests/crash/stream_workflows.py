"""The workflow the stream kill -9 test runs in a ``treadle worker`` subprocess.

``speak(n)`` writes ``n`` chunks ``a<attempt>-<i>`` to the ``tokens`` stream and
flushes them, records ``flushed <attempt>`` (with its pid) in the file named by
``TREADLE_TEST_EFFECTS``, then, on its first attempt with
``TREADLE_TEST_HANG_FIRST_ATTEMPT`` set, hangs so the test can kill the worker
mid-stream; otherwise it closes the stream and returns its attempt.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from treadle import Workflows, get_writable, step_metadata

app = Workflows()


def record(line: str) -> None:
    with Path(os.environ["TREADLE_TEST_EFFECTS"]).open("a") as effects:
        effects.write(line + "\n")
        effects.flush()
        os.fsync(effects.fileno())


@app.step(max_retries=3)
async def speak(n: int) -> int:
    attempt = step_metadata().attempt
    tokens = get_writable("tokens")
    for i in range(n):
        await tokens.write(f"a{attempt}-{i}")
    await tokens.flush()
    record(f"flushed {attempt} {os.getpid()}")
    if attempt == 1 and os.environ.get("TREADLE_TEST_HANG_FIRST_ATTEMPT"):
        await asyncio.sleep(3600)
    await tokens.close()
    return attempt


@app.workflow
async def chatter(n: int) -> int:
    return await speak(n)
