"""Reading a run's stream, live: ``run.stream(name)`` and ``run.stream_chunks(name)``.

The reader reads the stream from an index on (``contract.Streams.read``), yields its
chunks in order, and when it has read all there is waits for news: the stream's
append notifications (``Streams.subscribe``), the run's own events (its end, on the
live feed), or ``TREADLE_STREAM_POLL_SECONDS`` at the latest. It ends once it read
every chunk of a page that says the stream is closed or the run ended (the World
takes no chunk after a run's end, so nothing follows). Breaking out of the loop
closes the subscriptions.

Chunks are decoded with treadle's serde (with the app's payload keys when it has
them). ``stream_chunks`` yields ``Chunk`` records that also say which step attempt
wrote each chunk: a retried step's chunks follow the abandoned attempt's (the
retry rule, ``world.streamrules``).

Used by ``client.Run``, ``treadle runs stream`` and the serve API's SSE endpoint.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from treadle import errors, serde
from treadle.world import contract, events, records, streamrules

log = logging.getLogger("treadle.streamread")

PAGE = 1000


@dataclass(frozen=True, slots=True)
class Chunk:
    """A chunk as a reader sees it: its value, its index in the stream, and the step
    attempt that wrote it (``seq``: its place among that attempt's chunks)."""

    index: int
    value: Any
    step_id: str
    attempt: int
    seq: int
    created_at: datetime


def check_args(name: str, start: int) -> None:
    streamrules.check_name(name)
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise ValueError(f"stream {name!r}: start must be an index >= 0, got {start!r}")


def decode(chunk: records.StreamChunk, name: str) -> Chunk:
    value = serde.decode(chunk.data, f"stream {name!r} chunk {chunk.index}")
    return Chunk(chunk.index, value, chunk.step_id, chunk.attempt, chunk.seq, chunk.created_at)


async def read_chunks(
    world: contract.World, run_id: str, name: str, *, start: int, poll_seconds: float
) -> AsyncIterator[records.StreamChunk]:
    """The stored chunks of the stream from ``start``, live, until it is complete."""
    streams = streamrules.streams_of(world)
    news = asyncio.Event()
    subs: list[contract.Subscription] = [streams.subscribe(run_id, name, news.set)]
    try:
        run = await world.runs.get(run_id)
        subs.append(_follow_run(world, run, news))
        at = start
        while True:
            news.clear()
            page = await streams.read(run_id, name, start=at, limit=PAGE)
            for chunk in page.chunks:
                yield chunk
                at = chunk.index + 1
            if at < page.count:
                continue  # more stored than one page held
            if page.closed or page.run_ended:
                return
            try:
                async with asyncio.timeout(poll_seconds):
                    await news.wait()
            except TimeoutError:
                pass
    finally:
        for sub in subs:
            sub.close()


def _follow_run(
    world: contract.World, run: records.RunRecord, news: asyncio.Event
) -> contract.Subscription:
    """Wake the reader on the run's events (its end); a lost feed leaves the poll."""

    def on_event(_event: events.LoggedEvent) -> None:
        news.set()

    def on_error(exc: BaseException) -> None:
        log.info("run %s: stream reader's run feed failed (%s); polling", run.run_id, exc)

    try:
        return world.events.subscribe(run.run_id, run.seq, on_event, on_error)
    except errors.WorldError as exc:
        on_error(exc)
        return _NoSubscription()


class _NoSubscription:
    def close(self) -> None:
        return None
