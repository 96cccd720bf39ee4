"""A run's streams on the JSON API (issue 17 item 6): the list, and the chunks as
server-sent events, live, ending with ``event: end``; resuming from an index; a bad
name and an unknown run answered as JSON errors. Local World and Postgres + NATS."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from treadle import get_writable

from .conftest import READ_TOKEN, Served

READ_TIMEOUT = 15.0


async def _events(served: Served, path: str, **params: Any) -> list[tuple[str, str]]:
    """(event, data) of every SSE event until the stream ends."""
    found: list[tuple[str, str]] = []
    kind = "message"
    async with served.reader.stream("GET", path, params=params) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        async with asyncio.timeout(READ_TIMEOUT):
            async for line in stream.aiter_lines():
                if line.startswith("event: "):
                    kind = line[len("event: ") :]
                elif line.startswith("data: "):
                    found.append((kind, line[len("data: ") :]))
                    kind = "message"
    return found


async def test_the_chunks_stream_live_and_end_with_the_stream(served_any: Served) -> None:
    served = served_any
    app = served.app
    go = asyncio.Event()

    @app.step
    async def talk() -> str:
        out = get_writable("tokens")
        await out.write("Hel")
        await out.flush()
        await asyncio.wait_for(go.wait(), READ_TIMEOUT)
        await out.write({"n": 2})
        await out.close()
        return "ok"

    @app.workflow
    async def api_chat() -> str:
        return await talk()

    run = await app.start(api_chat)
    path = f"/api/runs/{run.run_id}/streams/tokens"
    async with served.reader.stream("GET", path) as stream:
        lines = stream.aiter_lines()
        async with asyncio.timeout(READ_TIMEOUT):
            async for line in lines:
                if line.startswith("data: "):
                    first = json.loads(line[len("data: ") :])
                    break
        assert (first["index"], first["data"], first["attempt"], first["seq"]) == (0, "Hel", 1, 0)
        go.set()  # chunk 2 is written only now
    assert await run.result(timeout=READ_TIMEOUT) == "ok"
    events = await _events(served, path)
    chunks = [json.loads(d) for k, d in events if k == "message"]
    assert [c["data"] for c in chunks] == ["Hel", {"n": 2}]
    assert events[-1] == ("end", json.dumps({"count": 2, "closed": True, "run_ended": True}))
    tail = await _events(served, path, start=1)
    assert [json.loads(d)["index"] for k, d in tail if k == "message"] == [1]
    listed = await served.reader.get(f"/api/runs/{run.run_id}/streams")
    assert listed.status_code == 200
    assert listed.json() == {
        "run_id": run.run_id,
        "streams": [{"name": "tokens", "count": 2, "closed": True}],
    }
    # An EventSource authenticates in the URL on this route.
    async with served.anonymous.stream("GET", path, params={"access_token": READ_TOKEN}) as stream:
        assert stream.status_code == 200


async def test_bad_stream_requests_are_json_errors(served: Served) -> None:
    missing = await served.reader.get("/api/runs/wrun_01ARZ3NDEKTSV4RRFFQ69G5FAV/streams/x")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "run_not_found"

    @served.app.step
    async def noop() -> None:
        return None

    @served.app.workflow
    async def api_noop() -> None:
        await noop()

    run = await served.app.start(api_noop)
    await run.result(timeout=READ_TIMEOUT)
    bad = await served.reader.get(f"/api/runs/{run.run_id}/streams/-bad")
    assert bad.status_code == 422
    assert "stream name" in bad.json()["error"]["message"]
    negative = await served.reader.get(f"/api/runs/{run.run_id}/streams/x", params={"start": -1})
    assert negative.status_code == 422
