"""Workflows the kill -9 tests run in a ``treadle worker`` subprocess.

Each step appends a line to the file named by ``TREADLE_TEST_EFFECTS`` (its
side effect, which the test counts) and, on its first attempt, hangs so the
test can kill the worker inside the body (with ``TREADLE_TEST_FIRST_GATE`` set, until
that file exists: a body the test stops and resumes, ending when the test says, never
racing the test's own checks); with ``TREADLE_TEST_GATE`` set, a later attempt waits
until that file exists. With ``TREADLE_TEST_KILL_BEFORE_SEND``
set, the worker kills itself with SIGKILL the first time it is about to send a
step's message, which is right after that step's ``step_created`` committed.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from treadle import StepFailed, Workflows, sleep, step_metadata
from treadle.world import messages
from treadle.worlds.local import queue as local_queue

app = Workflows()


def record(line: str) -> None:
    with Path(os.environ["TREADLE_TEST_EFFECTS"]).open("a") as effects:
        effects.write(line + "\n")
        effects.flush()
        os.fsync(effects.fileno())


async def _body(name: str) -> str:
    attempt = step_metadata().attempt
    with Path(os.environ["TREADLE_TEST_EFFECTS"] + ".pids").open("a") as pids:
        pids.write(f"{name} {attempt} {os.getpid()}\n")
    record(f"{name} start {attempt}")
    first_gate = os.environ.get("TREADLE_TEST_FIRST_GATE")
    if attempt == 1 and first_gate:
        while not Path(first_gate).exists():  # noqa: ASYNC110 - a file
            await asyncio.sleep(0.02)  # the test's file: nothing else to await
    elif attempt == 1 and os.environ.get("TREADLE_TEST_HANG_FIRST_ATTEMPT"):
        await asyncio.sleep(float(os.environ.get("TREADLE_TEST_HANG_SECONDS", "3600")))
    gate = os.environ.get("TREADLE_TEST_GATE")
    while attempt > 1 and gate and not Path(gate).exists():  # noqa: ASYNC110 - a file
        await asyncio.sleep(0.02)  # the test's file: nothing else to await
    record(f"{name} done {attempt}")
    return f"{name}:{attempt}"


@app.step(max_retries=3)
async def retried(name: str) -> str:
    return await _body(name)


@app.step(max_retries=0)
async def at_most_once(name: str) -> str:
    return await _body(name)


@app.workflow
async def steady(name: str, n: int) -> int:
    """n steps, one after another, with a short durable sleep between them."""
    for i in range(n):
        await retried(f"{name}{i}")
        await sleep(0.3)
    return n


@app.step
async def noop(i: int) -> int:
    return i


@app.workflow
async def fan(n: int) -> int:
    """A fanout.py-style workflow: n no-op steps in one gather."""
    return sum(await asyncio.gather(*(noop(i) for i in range(n))))


@app.workflow
async def one_step(name: str) -> str:
    return await retried(name)


@app.workflow
async def one_step_at_most_once(name: str) -> str:
    try:
        return await at_most_once(name)
    except StepFailed as exc:
        return f"failed: {exc.error_type}"


def _die_before_step_sends(queue_class: Any) -> None:
    send_batch = queue_class.send_batch

    async def send_or_die(self: Any, sends: list[messages.Send]) -> list[messages.SendResult]:
        if any(isinstance(s.message, messages.StepMessage) for s in sends):
            record("killed before the step message was sent")
            os.kill(os.getpid(), signal.SIGKILL)
        result: list[messages.SendResult] = await send_batch(self, sends)
        return result

    queue_class.send_batch = send_or_die


if os.environ.get("TREADLE_TEST_KILL_BEFORE_SEND"):
    _die_before_step_sends(local_queue.LocalQueue)
    if os.environ.get("TREADLE_WORLD") == "postgres":
        from treadle.worlds.nats import queue as nats_queue

        _die_before_step_sends(nats_queue.NatsQueue)
