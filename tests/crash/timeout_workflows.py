"""Workflows the timeout crash tests run in a ``treadle worker`` subprocess (issue 17
item 5): a heartbeating step, and a step with a start-to-close timeout.

Each body appends lines to ``TREADLE_TEST_EFFECTS`` (and its pid to ``.pids``) so the
test knows which worker to kill and what each attempt saw.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from treadle import Workflows, step_heartbeat, step_metadata
from treadle.world import contract

app = Workflows()


def record(line: str) -> None:
    with Path(os.environ["TREADLE_TEST_EFFECTS"]).open("a") as effects:
        effects.write(line + "\n")
        effects.flush()
        os.fsync(effects.fileno())


def _pid(name: str, attempt: int) -> None:
    with Path(os.environ["TREADLE_TEST_EFFECTS"] + ".pids").open("a") as pids:
        pids.write(f"{name} {attempt} {os.getpid()}\n")


@app.step(heartbeat_timeout="1.5s", max_retries=2)
async def crawl(name: str) -> dict[str, object]:
    """Attempt 1 beats ``{"done": 3}``, says so once the beat is stored, and keeps
    beating until its worker is killed; attempt 2 returns the details it was given."""
    meta = step_metadata()
    _pid(name, meta.attempt)
    record(f"{name} start {meta.attempt} {json.dumps(meta.heartbeat_details)}")
    if meta.attempt == 1:
        step_heartbeat({"done": 3})
        store = contract.heartbeats_of(await app.world())
        assert store is not None
        while await store.get(meta.run_id, meta.step_id) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.02)  # the store is another task's write
        record(f"{name} beat stored")
        while True:  # alive, beating, until the kill
            await asyncio.sleep(0.2)
            step_heartbeat({"done": 3})
    record(f"{name} done {meta.attempt}")
    return {"attempt": meta.attempt, "resumed": meta.heartbeat_details}


@app.workflow
async def heartbeating(name: str) -> dict[str, object]:
    return await crawl(name)


@app.step(timeout="60s", max_retries=2)
async def bounded(name: str) -> str:
    """Attempt 1 hangs (its worker is stopped or killed); later ones return at once."""
    meta = step_metadata()
    _pid(name, meta.attempt)
    record(f"{name} start {meta.attempt}")
    if meta.attempt == 1:
        await asyncio.sleep(float(os.environ.get("TREADLE_TEST_HANG_SECONDS", "3600")))
    record(f"{name} done {meta.attempt}")
    return f"{name}:{meta.attempt}"


@app.workflow
async def timed_step(name: str) -> str:
    return await bounded(name)
