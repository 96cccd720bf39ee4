"""Streams around step bodies: each attempt's writers, the run-ready barrier and the
stream-flush handoff (issue 17 item 6, docs/streams.md; seed 003 "Stream-flush
handoff", "Every write still lands after ``run_started``").

``steps.execute`` opens an ``AttemptStreams`` for every attempt it runs
(``open_scope``) and closes it when the body returned (``close_scope``): a writer
with chunks still on their way is then waited for (a background step, a spec 8
body: its chunks are stored before its outcome is written), or, for a spec 9
inline body (``inline_body`` set ``sdk.streams.DEFERRED``), left flushing in the
background: its outcome is written at once, and the delivery hands off once no
body runs (``InlineSteps.flush_handoff``), so the flush finishes and the run
continues in the handoff (the same message again at once). A delivery of a run
whose flushes still run in this process waits for them first (``wait_pending``),
and so does the run's terminal write (``RunSession.write_terminal``): the World
takes no chunk after a run's end, so a flush must land before it.

An optimistic body (turbo's early inline start, the opt-in background one) runs
before its ``step_started`` commits; ``sdk.streams.BARRIER`` makes its chunks wait
for that start (which commits behind ``run_started``), and fail instead of
writing when it is refused: a refused start leaves no chunks.

Used by ``steps``, ``inline`` and ``delivery``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from treadle.sdk import context, streams

if TYPE_CHECKING:
    from treadle.orchestrator.runtime import Runtime

log = logging.getLogger("treadle.orchestrator.streamflush")

T = TypeVar("T")

# How long a delivery waits for this process's flushes of its run before it goes on.
PENDING_WAIT_SECONDS = 30.0

# Flushes spec 9 inline bodies left running, by run (this process's).
_PENDING: dict[str, set[asyncio.Task[None]]] = {}


def config(rt: Runtime) -> streams.StreamConfig:
    s = rt.settings
    return streams.StreamConfig(
        max_chunk_bytes=s.TREADLE_MAX_STREAM_CHUNK_BYTES,
        flush_delay_ms=s.TREADLE_STREAM_FLUSH_DELAY_MS,
        buffer_chunks=s.TREADLE_STREAM_BUFFER_CHUNKS,
    )


def open_scope(
    rt: Runtime, meta: context.StepMetadata
) -> tuple[streams.AttemptStreams, contextvars.Token[streams.AttemptStreams | None]]:
    scope = streams.AttemptStreams(rt.world, meta, config(rt), streams.BARRIER.get())
    return scope, streams.ATTEMPT.set(scope)


async def close_scope(
    scope: streams.AttemptStreams,
    token: contextvars.Token[streams.AttemptStreams | None],
) -> None:
    """After the body: wait for its writers, or (spec 9 inline) leave them flushing."""
    streams.ATTEMPT.reset(token)
    if not scope.pending():
        return
    deferred = streams.DEFERRED.get()
    if deferred is None:
        await scope.settle()
        return
    meta = scope.meta
    task = asyncio.get_running_loop().create_task(
        scope.settle(), name=f"treadle-stream-flush-{meta.run_id}-{meta.step_id}"
    )
    deferred.add(task)
    pending = _PENDING.setdefault(meta.run_id, set())
    pending.add(task)
    task.add_done_callback(lambda done: _forget(meta.run_id, done))
    log.info(
        "run %s: step %s attempt %d returned with stream chunks still flushing",
        meta.run_id,
        meta.step_name,
        meta.attempt,
    )


def _forget(run_id: str, task: asyncio.Task[None]) -> None:
    pending = _PENDING.get(run_id)
    if pending is not None:
        pending.discard(task)
        if not pending:
            del _PENDING[run_id]


def inline_body(deferred: streams.Deferred, started: asyncio.Future[bool] | None) -> None:
    """In a spec 9 inline body's task: defer its trailing flush to ``deferred``; an early
    body's chunks wait on ``started`` (its start's commit)."""
    streams.DEFERRED.set(deferred)
    streams.BARRIER.set(started)


async def behind(gate: asyncio.Future[bool], work: Coroutine[Any, Any, T]) -> T:
    """``work`` (an optimistic background body) with its chunks behind ``gate``."""
    streams.BARRIER.set(gate)
    return await work


async def wait_pending(run_id: str, timeout: float = PENDING_WAIT_SECONDS) -> None:
    """Wait (bounded) for the flushes this process still runs for ``run_id``."""
    pending = [t for t in _PENDING.get(run_id, ()) if not t.done()]
    if not pending:
        return
    _, late = await asyncio.wait(pending, timeout=timeout)
    if late:
        log.warning(
            "run %s: %d stream flush(es) still running after %.0f s; the delivery goes on",
            run_id,
            len(late),
            timeout,
        )


def pending_runs() -> list[str]:
    """Runs with a flush still running in this process (tests, shutdown)."""
    return [run_id for run_id, tasks in _PENDING.items() if any(not t.done() for t in tasks)]
