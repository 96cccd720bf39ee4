"""``set_attributes()``: a run's searchable attributes, from workflow or step code.

In workflow code it records one ``attr_set`` per key at the replay positions the call
reaches (``Replay.set_attributes``): the run's orchestrator writes them in-band before
it acts on the pass, and a replay finds them in the log and never writes them again.
It returns at once; awaiting it is allowed and waits for nothing.

In step code (async or plain ``def``) each key is an out-of-band ``attr_set`` written
by the step's own writer (``STEP_WRITER``, bound by ``orchestrator.steps.execute``).
In an ``async def`` step it returns a task: ``await`` it to know the write landed (the
step's attempt waits for every write it started before its outcome is written either
way). In a plain ``def`` step (a worker thread) the call blocks until written.

Keys and values are checked at the call, before anything is recorded
(``treadle.world.attributes``): ``AttributeInvalid`` or a ``SerializationError``
naming the key. Outside a workflow or a step: ``WorkflowError`` (use
``run.set_attributes()``). See docs/attributes.md.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any

from pydantic import JsonValue

from treadle import errors, limits
from treadle.sdk import context
from treadle.world import attributes

StepWriter = Callable[[dict[str, JsonValue]], Awaitable[None]]


class StepAttributes:
    """The running step attempt's writer, and the writes it started (awaited by
    ``orchestrator.steps.execute`` before the attempt's outcome)."""

    def __init__(self, write: StepWriter, loop: asyncio.AbstractEventLoop) -> None:
        self.write = write
        self.loop = loop
        self.started: list[_Pending] = []

    async def settle(self) -> None:
        """Wait for every write started; raise the first failure of one the step code
        did not await (an awaited one's failure was raised to the code, which decided)."""
        for pending in self.started:
            if pending.awaited:
                await asyncio.wait([pending.task])
                if not pending.task.cancelled():
                    pending.task.exception()  # retrieved: the step code saw it
            else:
                await pending.task


STEP_WRITER: contextvars.ContextVar[StepAttributes | None] = contextvars.ContextVar(
    "treadle_step_attributes", default=None
)


class _Pending:
    """A step's write in flight, as ``set_attributes()`` returns it; knows if awaited."""

    def __init__(self, task: asyncio.Task[None]) -> None:
        self.task = task
        self.awaited = False

    def __await__(self) -> Generator[Any, None, None]:
        self.awaited = True
        return self.task.__await__()


class _Done:
    """An awaitable that is already done (workflow code, a plain ``def`` step)."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield


def set_attributes(values: Mapping[str, Any]) -> Awaitable[None]:
    """Set attributes of the current run (see the module docstring)."""
    checked = attributes.check_attributes(values, "set_attributes()", limits.active())
    replay = context.current_replay()
    if replay is not None:
        replay.set_attributes(checked)
        return _Done()
    step = STEP_WRITER.get()
    if step is None:
        raise errors.WorkflowError(
            "set_attributes() can only be called inside a workflow or a step; outside, "
            "use run.set_attributes()"
        )
    if not checked:
        return _Done()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is None:
        # A plain ``def`` step, in a worker thread: block until the write is done.
        asyncio.run_coroutine_threadsafe(_write(step, checked), step.loop).result()
        return _Done()
    pending = _Pending(running.create_task(_write(step, checked)))
    step.started.append(pending)
    return pending


async def _write(step: StepAttributes, values: dict[str, JsonValue]) -> None:
    await step.write(values)
