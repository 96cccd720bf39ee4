"""Bad input to the serve API (issue 13, "Bad input"): each class of mistake gets its 4xx
and a JSON error naming the problem, never a traceback, and nothing is written."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from .conftest import Served, StartServe
from .flows import define, wait_for_event

MISSING = "wrun_01ARZ3NDEKTSV4RRFFQ69G5FAV"


def _no_traceback(text: str) -> None:
    assert "Traceback" not in text
    assert 'File "' not in text


async def test_malformed_json_is_400_naming_where_it_breaks(served: Served) -> None:
    """A body that is not JSON: 400 malformed_json with the line and column; the run is
    not cancelled."""
    flows = define(served.app)
    run = await served.app.start(flows.nap)
    await wait_for_event(served.world, run.run_id, "wait_created")
    response = await served.client.post(
        f"/api/runs/{run.run_id}/cancel",
        content=b'{"reason": "oops",',
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "malformed_json"
    assert "line 1 column" in error["message"]
    _no_traceback(response.text)
    assert (await served.world.runs.get(run.run_id)).status == "running"


async def test_a_body_over_the_limit_is_413_before_it_is_read(start_serve: StartServe) -> None:
    """Content-Length over TREADLE_SERVE_MAX_BODY_BYTES: 413 at once; a chunked body with
    no length is refused as soon as it passes the limit; nothing is written."""
    served = await start_serve(TREADLE_SERVE_MAX_BODY_BYTES=2048)
    flows = define(served.app)
    run = await served.app.start(flows.approve, "tok-big-1")
    await wait_for_event(served.world, run.run_id, "hook_created")
    big = json.dumps({"payload": "x" * 5000}).encode()
    response = await served.client.post("/api/hooks/tok-big-1/resume", content=big)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "too_large"
    assert "2048" in response.json()["error"]["message"]

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b" " * 1024

    chunked = await served.client.post("/api/hooks/tok-big-1/resume", content=chunks())
    assert chunked.status_code == 413
    _no_traceback(chunked.text)
    log = [e.type for e in (await served.world.events.list(run.run_id)).events]
    assert "hook_received" not in log


async def test_an_unknown_run_is_404_on_every_run_route(served: Served) -> None:
    """A well-formed id no run has, and a malformed one: 404 run_not_found, naming it."""
    for path in ("", "/events", "/timeline", "/stream"):
        response = await served.client.get(f"/api/runs/{MISSING}{path}")
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "run_not_found"
        assert MISSING in response.json()["error"]["message"]
    for action in ("cancel", "wake", "rerun"):
        response = await served.client.post(f"/api/runs/{MISSING}/{action}")
        assert response.status_code == 404, action
    odd = await served.client.get("/api/runs/not-a-run")
    assert odd.status_code == 404
    assert "wrun_" in odd.json()["error"]["message"]


async def test_invalid_query_parameters_are_422_naming_the_field(served: Served) -> None:
    """A bad status, a limit out of range, an unknown parameter, a forged cursor, a
    negative after=: each 422 invalid_field naming the parameter."""
    cases = {
        "status": {"status": "sleeping"},
        "limit": {"limit": "0"},
        "colour": {"colour": "blue"},
        "cursor": {"cursor": "not-a-cursor"},
    }
    for field, params in cases.items():
        response = await served.client.get("/api/runs", params=params)
        assert response.status_code == 422, field
        error = response.json()["error"]
        assert error["code"] == "invalid_field"
        assert field in error["message"], (field, error)
        _no_traceback(response.text)
    search_cursor = await served.client.get("/api/runs", params={"q": "x", "cursor": "q.!!"})
    assert search_cursor.status_code == 422
    flows = define(served.app)
    run = await served.app.start(flows.hi, "q")
    await run.result(timeout=15)
    after = await served.client.get(f"/api/runs/{run.run_id}/events", params={"after": "-1"})
    assert after.status_code == 422
    assert "after" in after.json()["error"]["message"]


async def test_an_invalid_body_field_is_422_naming_it(served: Served) -> None:
    """A body of the wrong shape: 422 naming the field (an unknown one, a wrong type)."""
    wrong_type = await served.client.post(f"/api/runs/{MISSING}/wake", json={"waits": "all"})
    assert wrong_type.status_code == 422
    assert "waits" in wrong_type.json()["error"]["message"]
    unknown = await served.client.post(f"/api/runs/{MISSING}/cancel", json={"why": "x"})
    assert unknown.status_code == 422
    assert "why" in unknown.json()["error"]["message"]
    not_object = await served.client.post(f"/api/runs/{MISSING}/rerun", json=[1, 2])
    assert not_object.status_code == 422


async def test_the_read_only_role_on_an_action_is_403_and_writes_nothing(
    served: Served,
) -> None:
    """The read-only token on POST resume: 403 read_only; the hook still waits."""
    flows = define(served.app)
    run = await served.app.start(flows.approve, "tok-ro-1")
    await wait_for_event(served.world, run.run_id, "hook_created")
    response = await served.reader.post("/api/hooks/tok-ro-1/resume", json={"payload": {}})
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "read_only"
    log = [e.type for e in (await served.world.events.list(run.run_id)).events]
    assert "hook_received" not in log


async def test_no_credentials_and_a_wrong_method_are_json_errors(served: Served) -> None:
    """401 without credentials; 405 for GET on an action: each in the JSON error shape."""
    unauthenticated = await served.anonymous.post(f"/api/runs/{MISSING}/cancel")
    assert unauthenticated.status_code == 401
    assert unauthenticated.json()["error"]["code"] == "unauthorized"
    wrong_method = await served.client.get(f"/api/runs/{MISSING}/cancel")
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"


class _BrokenRuns:
    """A World's runs whose list fails as a bug would (not a treadle error)."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def list(self, **_: object) -> object:
        raise RuntimeError("a bug with a secret-looking detail")


class _World:
    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.runs = _BrokenRuns(inner.runs)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


async def test_an_unexpected_error_is_a_json_500_without_its_traceback(served: Served) -> None:
    """A failure that is no refusal: 500 internal naming only its type; no traceback, no
    exception text in the answer (the server logs it)."""
    served.ctx.world = _World(served.world)  # type: ignore[assignment]
    response = await served.client.get("/api/runs")
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "internal"
    assert "RuntimeError" in error["message"]
    assert "secret-looking" not in response.text
    _no_traceback(response.text)
