"""Server-sent events: ``GET /api/runs/{run_id}/stream`` and ``GET /api/stream``.

Each event's data is ``{"run_id", "slot"}``: that run has events up to ``slot``; the
page re-reads it. The run stream follows ``events.subscribe`` (and, the feed being
best effort, reads the run's ``seq`` every ``POLL_SECONDS`` too); its events carry
``id: <slot>``, so a reconnecting EventSource resumes after the last one it saw
(``Last-Event-ID``, or ``?after=``). The list stream follows ``changes.watch``;
when the World cannot tell what changed it sends ``event: resync`` (re-read the
list). Reports are coalesced (one per run, its highest slot). A comment line
(``: keep-alive``) goes out every ``TREADLE_SERVE_STREAM_KEEPALIVE_SECONDS`` so
proxies keep the connection; the stream ends cleanly when the client goes away or
the server stops (``ctx.stopping``), and its subscription is closed either way.

Auth (``?access_token=`` is accepted here) is ``serve.auth``'s; the run is looked up
and the feed set up before the response starts, so a 404 or 503 is still JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from treadle.serve import http, models, runsapi
from treadle.serve.context import ServeContext
from treadle.world import events

log = logging.getLogger("treadle.serve.stream")

POLL_SECONDS = 2.0
RETRY_MS = 3000
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}


def frame(run_id: str, slot: int, *, with_id: bool) -> bytes:
    data = models.StreamEvent(run_id=run_id, slot=slot).model_dump_json()
    head = f"id: {slot}\n" if with_id else ""
    return f"{head}data: {data}\n\n".encode()


class Reports:
    """What the World's callbacks reported since the stream last looked: coalesced."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.pending: dict[str, int] = {}
        self.resync = False
        self.news = asyncio.Event()

    def _add(self, run_id: str, slot: int) -> None:
        self.pending[run_id] = max(slot, self.pending.get(run_id, 0))
        self.news.set()

    def _flag(self) -> None:
        self.resync = True
        self.news.set()

    def report(self, run_id: str, slot: int) -> None:
        """Safe from any thread (a World may call back from its own)."""
        self._loop.call_soon_threadsafe(self._add, run_id, slot)

    def lost(self) -> None:
        self._loop.call_soon_threadsafe(self._flag)

    async def wait(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.news.wait(), seconds)
        self.news.clear()

    def take(self) -> tuple[dict[str, int], bool]:
        pending, resync = self.pending, self.resync
        self.pending, self.resync = {}, False
        return pending, resync


class EventStream(Response):
    """An SSE response over ``frames``; ends on disconnect or ``stopping``, then ``on_close``."""

    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncGenerator[bytes, None],
        *,
        stopping: asyncio.Event,
        on_close: Callable[[], None],
    ) -> None:
        # No Content-Length: the body is open-ended (Response.__init__ would set one).
        self.status_code = 200
        self.background = None
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8")] + [
            (k.lower().encode(), v.encode()) for k, v in HEADERS.items()
        ]
        self.frames = frames
        self.stopping = stopping
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = False

        async def pump() -> None:
            async for chunk in self.frames:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})

        async def disconnected() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True

        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            tasks = [
                asyncio.create_task(pump()),
                asyncio.create_task(disconnected()),
                asyncio.create_task(self.stopping.wait()),
            ]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            for task in done:
                if not task.cancelled() and task.exception() is not None and not gone:
                    exc = task.exception()
                    log.warning("stream %s ended on %s: %s", scope["path"], type(exc).__name__, exc)
            if not gone:
                with contextlib.suppress(OSError):
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            # on_close (the subscription's close) runs even when this task is cancelled
            # while the frames close: a cancelled await here must not leak the feed.
            try:
                with contextlib.suppress(Exception):
                    await self.frames.aclose()
            finally:
                self.on_close()


def _after(request: Request, query: models.StreamQuery) -> int:
    last = request.headers.get("last-event-id", "").strip()
    return max(query.after, int(last)) if last.isdigit() else query.after


async def _run_frames(
    ctx: ServeContext, run_id: str, after: int, reports: Reports
) -> AsyncGenerator[bytes, None]:
    keepalive = ctx.serve.TREADLE_SERVE_STREAM_KEEPALIVE_SECONDS
    loop = asyncio.get_running_loop()
    yield f"retry: {RETRY_MS}\n: connected\n\n".encode()
    last, quiet_since, polled = after, loop.time(), float("-inf")
    while True:
        pending, lost = reports.take()
        slot = pending.get(run_id, 0)
        now = loop.time()
        if lost or now - polled >= POLL_SECONDS:  # the feed is best effort: read seq too
            slot, polled = max(slot, (await ctx.world.runs.get(run_id)).seq), now
        if slot > last:
            yield frame(run_id, slot, with_id=True)
            last, quiet_since = slot, now
        elif now - quiet_since >= keepalive:
            yield b": keep-alive\n\n"
            quiet_since = now
        await reports.wait(min(keepalive, POLL_SECONDS))


async def run_stream(ctx: ServeContext, request: Request) -> Response:
    run_id = runsapi.check_run_id(request.path_params["run_id"])
    after = _after(request, http.query(request, models.StreamQuery))
    await ctx.world.runs.get(run_id)  # 404 before the stream starts
    reports = Reports()

    def on_event(event: events.LoggedEvent) -> None:
        reports.report(run_id, event.slot)

    sub = ctx.world.events.subscribe(run_id, after, on_event, lambda exc: reports.lost())
    return EventStream(
        _run_frames(ctx, run_id, after, reports), stopping=ctx.stopping, on_close=sub.close
    )


async def _list_frames(ctx: ServeContext, reports: Reports) -> AsyncGenerator[bytes, None]:
    keepalive = ctx.serve.TREADLE_SERVE_STREAM_KEEPALIVE_SECONDS
    yield f"retry: {RETRY_MS}\n: connected\n\n".encode()
    while True:
        await reports.wait(keepalive)
        pending, lost = reports.take()
        if not pending and not lost:
            yield b": keep-alive\n\n"
            continue
        for run_id, slot in pending.items():
            yield frame(run_id, slot, with_id=False)
        if lost:
            yield b"event: resync\ndata: {}\n\n"


async def list_stream(ctx: ServeContext, request: Request) -> Response:
    http.query(request, models.NoQuery)
    reports = Reports()
    sub = await ctx.world.changes.watch(
        lambda change: reports.report(change.run_id, change.slot), reports.lost
    )
    return EventStream(_list_frames(ctx, reports), stopping=ctx.stopping, on_close=sub.close)
