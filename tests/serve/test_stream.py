"""Server-sent events (issue 13 item 1): the run stream delivers a running run's new
event, the list stream a new run; keep-alives; a clean close on disconnect and on stop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from treadle.world import contract

from .conftest import Served, StartServe
from .flows import define, wait_for_event

READ_TIMEOUT = 15.0


async def _data_lines(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    async for line in lines:
        if line.startswith("data: "):
            yield json.loads(line[len("data: ") :])


async def _until_connected(lines: AsyncIterator[str]) -> None:
    async for line in lines:
        if line == ": connected":
            return
    raise AssertionError("the stream ended before it said connected")


async def test_run_stream_delivers_a_new_event_of_a_running_run(served_any: Served) -> None:
    """A run waits on a hook; a client streams it from its current slot; resuming the hook
    writes hook_received, and the stream reports the run at that slot or later (local
    World and Postgres + NATS)."""
    served = served_any
    flows = define(served.app)
    run = await served.app.start(flows.approve, "tok-stream-1")
    created = await wait_for_event(served.world, run.run_id, "hook_created")
    now = (await served.world.runs.get(run.run_id)).seq
    async with served.reader.stream(
        "GET", f"/api/runs/{run.run_id}/stream", params={"after": now}
    ) as stream:
        assert stream.status_code == 200
        lines = stream.aiter_lines()
        await asyncio.wait_for(_until_connected(lines), READ_TIMEOUT)
        resumed = await served.client.post(
            "/api/hooks/tok-stream-1/resume", json={"payload": {"approved": True}}
        )
        assert resumed.status_code == 202
        received = await wait_for_event(served.world, run.run_id, "hook_received")

        async def first_report() -> dict[str, Any]:
            async for data in _data_lines(lines):
                return data
            raise AssertionError("the stream ended")

        data = await asyncio.wait_for(first_report(), READ_TIMEOUT)
    assert data["run_id"] == run.run_id
    assert data["slot"] > created.slot
    assert data["slot"] >= received.slot > now


async def test_list_stream_reports_a_new_run(served_any: Served) -> None:
    """/api/stream (changes.watch) reports a run started after the client connected (local
    World and Postgres + NATS)."""
    served = served_any
    flows = define(served.app)
    async with served.client.stream("GET", "/api/stream") as stream:
        lines = stream.aiter_lines()
        await asyncio.wait_for(_until_connected(lines), READ_TIMEOUT)
        run = await served.app.start(flows.hi, "sse")

        async def report_of_run() -> dict[str, Any]:
            async for data in _data_lines(lines):
                if data["run_id"] == run.run_id:
                    return data
            raise AssertionError("the stream ended")

        data = await asyncio.wait_for(report_of_run(), READ_TIMEOUT)
    assert data["slot"] >= 1


async def test_streams_send_keep_alives(start_serve: StartServe) -> None:
    """With nothing to report, a comment line goes out every keep-alive interval."""
    served = await start_serve(TREADLE_SERVE_STREAM_KEEPALIVE_SECONDS=0.2)
    async with served.client.stream("GET", "/api/stream") as stream:
        lines = stream.aiter_lines()

        async def keep_alive() -> None:
            async for line in lines:
                if line == ": keep-alive":
                    return

        await asyncio.wait_for(keep_alive(), READ_TIMEOUT)


class _CountingEvents:
    """The World's events, counting the subscriptions open (to see them closed)."""

    def __init__(self, inner: contract.Events) -> None:
        self.inner = inner
        self.open = 0
        self.closed = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def subscribe(self, *args: Any) -> contract.Subscription:
        sub = self.inner.subscribe(*args)
        self.open += 1
        counter = self

        class Closing:
            def close(self) -> None:
                sub.close()
                counter.open -= 1
                counter.closed.set()

        return Closing()


class _World:
    def __init__(self, inner: contract.World, events: _CountingEvents) -> None:
        self._inner = inner
        self.events = events

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_a_client_going_away_closes_the_runs_subscription(served: Served) -> None:
    """When the client disconnects, the stream ends and its events.subscribe is closed."""
    flows = define(served.app)
    run = await served.app.start(flows.nap)
    await wait_for_event(served.world, run.run_id, "wait_created")
    counting = _CountingEvents(served.world.events)
    served.ctx.world = _World(served.world, counting)  # type: ignore[assignment]
    client = served.client_for(token=None, headers=dict(served.client.headers))
    async with client.stream("GET", f"/api/runs/{run.run_id}/stream") as stream:
        await asyncio.wait_for(_until_connected(stream.aiter_lines()), READ_TIMEOUT)
        assert counting.open == 1
    await client.aclose()
    await asyncio.wait_for(counting.closed.wait(), READ_TIMEOUT)
    assert counting.open == 0


async def test_stopping_the_server_ends_open_streams(start_serve: StartServe) -> None:
    """server.stop() with a stream open: the stream ends (the client reads its end) and
    stop returns well inside the grace period."""
    served = await start_serve()
    async with served.client.stream("GET", "/api/stream") as stream:
        lines = stream.aiter_lines()
        await asyncio.wait_for(_until_connected(lines), READ_TIMEOUT)
        loop = asyncio.get_running_loop()
        began = loop.time()
        stopping = asyncio.create_task(served.server.stop())

        async def drain() -> None:
            try:
                async for _line in lines:
                    pass
            except httpx.RemoteProtocolError:
                pass

        await asyncio.wait_for(drain(), READ_TIMEOUT)
        await asyncio.wait_for(stopping, READ_TIMEOUT)
        assert loop.time() - began < 4.0
