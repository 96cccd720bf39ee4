"""The app's wiring (issue 13 item 1): /healthz without credentials, every other route
behind auth, unknown routes as JSON errors, and the fixture's real server."""

from __future__ import annotations

from .conftest import Served, StartServe


async def test_healthz_answers_without_credentials(served: Served) -> None:
    """``GET /healthz`` is public: 200 ``{"status": "ok"}`` with no Authorization."""
    response = await served.anonymous.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_an_unknown_route_is_a_json_404(served: Served) -> None:
    """A route nothing serves is 404 in the JSON error shape, naming the path."""
    response = await served.client.get("/api/nothing-here")
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "not_found"
    assert "/api/nothing-here" in error["message"]


async def test_the_api_refuses_a_request_without_credentials(served: Served) -> None:
    """No credentials on /api/*: 401 ``unauthorized`` with a Bearer challenge."""
    response = await served.anonymous.get("/api/runs")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert response.headers["www-authenticate"].startswith("Bearer")


async def test_the_postgres_nats_fixture_serves_too(served_pg: Served) -> None:
    """The same app over Postgres + NATS answers on its own port."""
    response = await served_pg.anonymous.get("/healthz")
    assert response.status_code == 200
    assert served_pg.url != ""


async def test_two_servers_take_two_ports(start_serve: StartServe) -> None:
    """Each server binds its own ephemeral port on 127.0.0.1."""
    one, two = await start_serve(), await start_serve()
    assert one.url != two.url
    assert one.url.startswith("http://127.0.0.1:")
