"""A run's streams on the JSON API (issue 17 item 6, docs/streams.md, docs/serve.md):

- ``GET /api/runs/{run_id}/streams``: the run's streams (name, chunk count, closed);
- ``GET /api/runs/{run_id}/streams/{name}``: server-sent events, one per chunk, live:
  ``id: <index>`` and data ``{"index", "step_id", "attempt", "seq", "data"}`` (the
  chunk's stored JSON, encrypted values opened with serve's keys); once the stream is
  closed or the run ended, ``event: end`` with ``{"count", "closed", "run_ended"}``,
  and the response ends. ``?start=`` (or ``Last-Event-ID`` + 1 on a reconnect)
  resumes from an index.

The stream follows ``treadle.streamread`` (the stream's notifications, the run's
feed, a poll); a comment line keeps the connection alive. The run and the name are
checked before the response starts, so a 404 or 422 is still JSON.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response

from treadle import errors, payloads, streamread
from treadle.serve import http, runsapi, stream
from treadle.serve.context import ServeContext
from treadle.world import records, streamrules


class StreamSummary(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    count: int = Field(description="Chunks stored.")
    closed: bool = Field(description="A writer closed the stream.")


class StreamList(BaseModel):
    model_config = ConfigDict(frozen=True)
    run_id: str
    streams: list[StreamSummary]


class StreamChunksQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    start: int = Field(default=0, ge=0, description="Send chunks from this index on.")


def _name(request: Request) -> str:
    name = request.path_params["name"]
    try:
        return streamrules.check_name(name)
    except errors.StreamNameInvalid as exc:
        raise errors.RequestRefused(422, "invalid_field", str(exc)) from None


async def list_streams(ctx: ServeContext, request: Request) -> StreamList:
    run_id = runsapi.check_run_id(request.path_params["run_id"])
    found = await streamrules.streams_of(ctx.world).list(run_id)
    return StreamList(
        run_id=run_id,
        streams=[StreamSummary(name=s.name, count=s.count, closed=s.closed) for s in found],
    )


def _chunk_frame(chunk: records.StreamChunk, keys: payloads.KeyRing | None) -> bytes:
    data: dict[str, Any] = {
        "index": chunk.index,
        "step_id": chunk.step_id,
        "attempt": chunk.attempt,
        "seq": chunk.seq,
        "data": payloads.display(chunk.data, keys),
    }
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    return f"id: {chunk.index}\ndata: {text}\n\n".encode()


async def _frames(
    ctx: ServeContext, run_id: str, name: str, start: int
) -> AsyncGenerator[bytes, None]:
    keys = ctx.client.payload_keys
    keepalive = ctx.serve.TREADLE_SERVE_STREAM_KEEPALIVE_SECONDS
    yield f"retry: {stream.RETRY_MS}\n: connected\n\n".encode()
    queue: asyncio.Queue[records.StreamChunk | None] = asyncio.Queue()

    async def follow() -> None:
        try:
            async for chunk in streamread.read_chunks(
                ctx.world, run_id, name, start=start, poll_seconds=stream.POLL_SECONDS
            ):
                await queue.put(chunk)
        finally:
            await queue.put(None)

    reader = asyncio.get_running_loop().create_task(follow())
    count = start
    try:
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), keepalive)
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            if item is None:
                break
            count = item.index + 1
            yield _chunk_frame(item, keys)
        reader.result()  # a read failure ends the stream with its error logged
        page = await streamrules.streams_of(ctx.world).read(run_id, name, start=count, limit=1)
        end = {"count": page.count, "closed": page.closed, "run_ended": page.run_ended}
        yield f"event: end\ndata: {json.dumps(end)}\n\n".encode()
    finally:
        reader.cancel()


async def stream_chunks(ctx: ServeContext, request: Request) -> Response:
    run_id = runsapi.check_run_id(request.path_params["run_id"])
    name = _name(request)
    start = http.query(request, StreamChunksQuery).start
    last = request.headers.get("last-event-id", "").strip()
    if last.isdigit():
        start = max(start, int(last) + 1)
    await ctx.world.runs.get(run_id)  # 404 before the stream starts
    return stream.EventStream(
        _frames(ctx, run_id, name, start), stopping=ctx.stopping, on_close=lambda: None
    )
