"""Streams from step code: ``get_writable(name)`` and its ``StreamWriter``.

A step writes chunks (any value treadle's serde encodes: str, bytes, numbers, lists,
dicts, declared dataclasses and pydantic models) to a named stream of its run;
anyone reads them with ``run.stream(name)`` (docs/streams.md)::

    @app.step
    async def generate(prompt: str) -> str:
        async with get_writable("tokens") as tokens:
            async for token in model(prompt):
                await tokens.write(token)
        return "done"

``write`` checks the chunk (serde, ``TREADLE_MAX_STREAM_CHUNK_BYTES``) at the call,
raising before anything is recorded, and hands it to the writer's flusher, which
writes what gathered to the World in one append (``contract.Streams``); it waits
only when ``TREADLE_STREAM_BUFFER_CHUNKS`` chunks are unwritten. ``flush()`` returns
once every chunk written so far is stored; ``close()`` flushes and closes the stream
(final: readers end; a later write anywhere raises ``StreamClosedError``). ``async
with`` closes on a clean exit and only flushes when the block raised (so a retry can
go on writing). Sync steps (run in a thread) use ``write_sync``, ``flush_sync`` and
``close_sync``.

An attempt's chunks carry its step id, attempt and their order (``seq``); the
World takes them only from the step's latest started attempt (``streamrules``).
A writer whose chunks were refused (its attempt went stale, the run ended, or an
optimistic start was refused: the barrier below) raises that refusal on every
later call.

The orchestrator opens one ``AttemptStreams`` per step attempt (``attempt_scope``,
from ``orchestrator.streamflush``): ``get_writable`` returns its writer for the name
(one per name and attempt). Two context variables tune it: ``BARRIER``, the
future an optimistic body's chunks wait on (True once its start committed; False:
refused, the chunks fail instead of writing, seed 003 "Stream and attribute writes
waiting on the barrier fail instead of writing"), and ``DEFERRED``, where a spec 9
inline body leaves the flush still running when it returns (the stream-flush
handoff) instead of waiting for it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from pydantic import JsonValue

from treadle import errors, limits, serde
from treadle.sdk import context
from treadle.world import contract, streamrules

log = logging.getLogger("treadle.sdk.streams")

T = TypeVar("T")

# How long an optimistic body's chunks wait for its start before they count it refused.
BARRIER_BOUND_SECONDS = 120.0
# Tries of one append on a storage error (the seq makes a retry converge), first backoff.
APPEND_TRIES = 5
APPEND_RETRY_SECONDS = 0.05


@dataclass(frozen=True, slots=True)
class StreamConfig:
    max_chunk_bytes: int = 256 * 1024
    flush_delay_ms: int = 0
    buffer_chunks: int = 1000


class Deferred:
    """Flushes a spec 9 inline body left running when it returned (one delivery's)."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()

    def add(self, task: asyncio.Task[None]) -> None:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def pending(self) -> bool:
        return any(not task.done() for task in self.tasks)


BARRIER: contextvars.ContextVar[asyncio.Future[bool] | None] = contextvars.ContextVar(
    "treadle_stream_barrier", default=None
)
DEFERRED: contextvars.ContextVar[Deferred | None] = contextvars.ContextVar(
    "treadle_stream_deferred", default=None
)
ATTEMPT: contextvars.ContextVar[AttemptStreams | None] = contextvars.ContextVar(
    "treadle_stream_attempt", default=None
)


class AttemptStreams:
    """The stream writers of one step attempt."""

    def __init__(
        self,
        world: object,
        meta: context.StepMetadata,
        config: StreamConfig,
        barrier: asyncio.Future[bool] | None,
    ) -> None:
        self._world = world
        self.meta = meta
        self.config = config
        self.barrier = barrier
        self.loop = asyncio.get_running_loop()
        self.writers: dict[str, StreamWriter] = {}

    def writer(self, name: str) -> StreamWriter:
        writer = self.writers.get(name)
        if writer is None:
            writer = StreamWriter(self, name, streamrules.streams_of(self._world))
            self.writers[name] = writer
        return writer

    def pending(self) -> bool:
        """Whether a writer still has chunks (or a close) on the way to the World."""
        return any(w.pending for w in self.writers.values())

    async def settle(self) -> None:
        """Let every writer's flush finish; a failure is logged (the body returned)."""
        for writer in list(self.writers.values()):
            try:
                await (writer.close() if writer.closed else writer.flush())
            except errors.TreadleError as exc:
                log.warning(
                    "run %s: step %s attempt %d: stream %r chunks were not all stored: %s",
                    self.meta.run_id,
                    self.meta.step_name,
                    self.meta.attempt,
                    writer.name,
                    exc,
                )


def get_writable(name: str = streamrules.DEFAULT_NAME) -> StreamWriter:
    """The current step attempt's writer for stream ``name`` (default ``"default"``).

    A bad name is ``StreamNameInvalid``; outside a step (workflow code included: it is
    replayed, so its writes would repeat) a ``StreamError``; nothing is recorded.
    """
    streamrules.check_name(name)
    scope = ATTEMPT.get()
    if scope is None:
        where = "workflow code" if context.current_replay() is not None else "this code"
        raise errors.StreamError(
            f"get_writable({name!r}) is called in {where}: streams are written from a step "
            "(@app.step); pass what the workflow knows to a step that writes it"
        )
    return scope.writer(name)


class StreamWriter:
    """Writes one step attempt's chunks to one stream (see the module docstring)."""

    def __init__(self, scope: AttemptStreams, name: str, streams: contract.Streams) -> None:
        self._scope = scope
        self._streams = streams
        self.name = name
        self.run_id = scope.meta.run_id
        self._buffer: list[JsonValue] = []
        self._accepted = 0  # chunks write() took
        self._stored = 0  # chunks the World stored (the attempt's next seq)
        self._close_wanted = False
        self._close_stored = False
        self._error: errors.TreadleError | None = None
        self._cond = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    @property
    def closed(self) -> bool:
        return self._close_wanted

    @property
    def written(self) -> int:
        """Chunks accepted by ``write`` so far."""
        return self._accepted

    @property
    def pending(self) -> bool:
        if self._error is not None:
            return False
        return self._stored < self._accepted or (self._close_wanted and not self._close_stored)

    def _check_open(self) -> None:
        if self._error is not None:
            raise self._error
        if self._close_wanted:
            raise errors.StreamClosedError(self.run_id, self.name, "this writer was closed")

    def _encode(self, chunk: Any) -> JsonValue:
        where = f"stream {self.name!r} chunk {self._accepted}"
        data = serde.encode(chunk, where, sized=False)
        size = limits.stored_size(data)
        cap = self._scope.config.max_chunk_bytes
        if size > cap:
            raise errors.ValueLimitExceeded(
                where,
                f"{size} bytes as JSON, over the {cap}-byte limit "
                "(TREADLE_MAX_STREAM_CHUNK_BYTES); split it into smaller chunks",
                setting="TREADLE_MAX_STREAM_CHUNK_BYTES",
                limit=cap,
            )
        return data

    async def write(self, chunk: Any) -> None:
        """Take ``chunk``; raises at once, nothing recorded, for a closed writer, a value
        serde cannot encode or one over ``TREADLE_MAX_STREAM_CHUNK_BYTES``."""
        self._check_open()
        data = self._encode(chunk)
        async with self._cond:
            self._buffer.append(data)
            self._accepted += 1
            self._cond.notify_all()
        self._start()
        if len(self._buffer) >= self._scope.config.buffer_chunks:
            await self._wait_stored(self._accepted - self._scope.config.buffer_chunks + 1)

    async def flush(self) -> None:
        """Return once every chunk written so far is stored (raise why not)."""
        if self._error is not None:
            raise self._error
        await self._wait_stored(self._accepted)

    async def close(self) -> None:
        """Flush and close the stream (readers end). Closing again does nothing."""
        if self._error is not None:
            raise self._error
        if not self._close_wanted:
            async with self._cond:
                self._close_wanted = True
                self._cond.notify_all()
            self._start()
        async with self._cond:
            await self._cond.wait_for(lambda: self._close_stored or self._error is not None)
        if self._error is not None:
            raise self._error

    async def __aenter__(self) -> StreamWriter:
        self._check_open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            await self.close()
        elif self._error is None and not isinstance(exc, asyncio.CancelledError):
            await self.flush()  # the step failed: keep the stream open for its retry

    # -- sync steps (run in a worker thread) ---------------------------------------------

    def _from_thread(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        loop = self._scope.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise errors.StreamError(
                f"stream {self.name!r}: the *_sync methods are for sync steps; await write()"
            )
        return asyncio.run_coroutine_threadsafe(make(), loop).result()

    def write_sync(self, chunk: Any) -> None:
        self._from_thread(lambda: self.write(chunk))

    def flush_sync(self) -> None:
        self._from_thread(self.flush)

    def close_sync(self) -> None:
        self._from_thread(self.close)

    # -- the flusher ----------------------------------------------------------------------

    def _start(self) -> None:
        if self._task is None:
            self._task = self._scope.loop.create_task(
                self._flush_loop(), name=f"treadle-stream-{self.run_id}-{self.name}"
            )

    async def _wait_stored(self, target: int) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: self._stored >= target or self._error is not None)
        if self._error is not None:
            raise self._error

    async def _flush_loop(self) -> None:
        try:
            await self._flushes()
        except errors.TreadleError as exc:
            await self._fail(exc)
        except Exception as exc:  # never leave a waiter hanging on a bug
            await self._fail(errors.StreamError(f"stream {self.name!r} flush failed: {exc}"))
            raise

    async def _flushes(self) -> None:
        config = self._scope.config
        while True:
            async with self._cond:
                await self._cond.wait_for(
                    lambda: bool(self._buffer) or (self._close_wanted and not self._close_stored)
                )
            if config.flush_delay_ms:
                await asyncio.sleep(config.flush_delay_ms / 1000)
            await self._behind_barrier()
            batch = self._buffer[: config.buffer_chunks]
            close = self._close_wanted and len(batch) == len(self._buffer)
            await self._append(batch, close)
            async with self._cond:
                del self._buffer[: len(batch)]
                self._stored += len(batch)
                self._close_stored = close
                self._cond.notify_all()
            if close:
                return

    async def _behind_barrier(self) -> None:
        barrier = self._scope.barrier
        if barrier is None:
            return
        if not barrier.done():
            await asyncio.wait([barrier], timeout=BARRIER_BOUND_SECONDS)  # never cancels it
        started = (
            barrier.done()
            and not barrier.cancelled()
            and barrier.exception() is None
            and barrier.result()
        )
        if not started:
            raise errors.StreamWriteRefused(
                self.run_id,
                self.name,
                "start_refused",
                f"step {self._scope.meta.step_name}'s body ran before its start, which was "
                "refused; its chunks are not written",
            )

    async def _append(self, batch: list[JsonValue], close: bool) -> None:
        meta = self._scope.meta
        for tries in range(1, APPEND_TRIES + 1):
            try:
                await self._streams.append(
                    self.run_id,
                    self.name,
                    batch,
                    step_id=meta.step_id,
                    attempt=meta.attempt,
                    first_seq=self._stored,
                    close=close,
                )
                return
            except errors.StorageUnavailable as exc:
                if tries == APPEND_TRIES:
                    raise
                log.info(
                    "run %s: stream %r append failed (%s); trying again",
                    self.run_id,
                    self.name,
                    exc,
                )
                await asyncio.sleep(APPEND_RETRY_SECONDS * 2 ** (tries - 1))

    async def _fail(self, exc: errors.TreadleError) -> None:
        log.info("run %s: stream %r writer stops: %s", self.run_id, self.name, exc)
        async with self._cond:
            self._error = exc
            self._buffer.clear()
            self._cond.notify_all()
