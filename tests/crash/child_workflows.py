"""Child workflows the kill -9 tests run in a ``treadle worker`` subprocess
(tests/crash/test_kill9_children.py).

``parent(name)`` awaits ``child(name)``, whose one step appends lines to the file named
by ``TREADLE_TEST_EFFECTS`` and, on its first attempt with ``TREADLE_TEST_HANG_FIRST_ATTEMPT``
set, hangs, so the test kills the worker after the child was created and before the
parent learned its result. ``TREADLE_TEST_CHILD_KILL`` makes the worker SIGKILL itself
once (a marker file beside the effects file remembers it) at a point of the child
machinery: ``before_create`` (the parent's ``child_created`` committed, the child run not
yet created) or ``before_report`` (the child's terminal event committed, its outcome not
yet written into the parent's log).
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from treadle import Workflows, step_metadata
from treadle.orchestrator import children

app = Workflows()


def record(line: str) -> None:
    with Path(os.environ["TREADLE_TEST_EFFECTS"]).open("a") as effects:
        effects.write(line + "\n")
        effects.flush()
        os.fsync(effects.fileno())


@app.step(max_retries=3)
async def work(name: str) -> str:
    attempt = step_metadata().attempt
    record(f"{name} start {attempt}")
    if attempt == 1 and os.environ.get("TREADLE_TEST_HANG_FIRST_ATTEMPT"):
        await asyncio.sleep(3600)
    record(f"{name} done {attempt}")
    return f"{name}:{attempt}"


@app.workflow
async def child(name: str) -> str:
    return await work(name)


@app.workflow
async def parent(name: str) -> str:
    return "parent got " + await child(name)


def _kill_once(point: str) -> None:
    if os.environ.get("TREADLE_TEST_CHILD_KILL") != point:
        return
    marker = Path(os.environ["TREADLE_TEST_EFFECTS"] + f".killed-{point}")
    if marker.exists():
        return
    marker.write_text("killed")
    record(f"killed {point}")
    os.kill(os.getpid(), signal.SIGKILL)


_create_run = children._create_run
_report = children.report


async def _killing_create_run(*args: Any, **kwargs: Any) -> Any:
    _kill_once("before_create")
    return await _create_run(*args, **kwargs)


async def _killing_report(*args: Any, **kwargs: Any) -> Any:
    _kill_once("before_report")
    return await _report(*args, **kwargs)


children._create_run = _killing_create_run  # type: ignore[assignment]
children.report = _killing_report  # type: ignore[assignment]
