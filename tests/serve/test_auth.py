"""Auth of treadle serve (issue 13 item 1): bearer tokens with two roles, a trusted proxy
header, ?access_token= on the stream routes only, public routes, CORS closed by default,
and no start without auth unless --insecure-no-auth."""

from __future__ import annotations

import pytest

from treadle import errors
from treadle.serve import settings as serve_settings
from treadle.serve.app import create_app
from treadle.serve.context import ServeContext

from .conftest import FULL_TOKEN, READ_TOKEN, Served, StartServe


async def test_a_wrong_token_is_401_and_names_no_secret(served: Served) -> None:
    """A bearer token that is neither configured one: 401 bad_credentials, and the answer
    holds neither the given token nor a configured one."""
    wrong = served.client_for(token="x" * 40)
    response = await wrong.get("/api/runs")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "bad_credentials"
    for secret in ("x" * 40, FULL_TOKEN, READ_TOKEN):
        assert secret not in response.text
    basic = served.client_for(headers={"Authorization": "Basic dXNlcjpwYXNz"})
    assert (await basic.get("/api/runs")).json()["error"]["code"] == "bad_credentials"


async def test_both_roles_read_and_only_the_full_role_acts(served: Served) -> None:
    """Full and read-only tokens both GET /api/runs; a POST with the read-only one is 403
    read_only, with the full one it reaches the route (404: no such run)."""
    assert (await served.client.get("/api/runs")).status_code == 200
    assert (await served.reader.get("/api/runs")).status_code == 200
    missing = "wrun_01ARZ3NDEKTSV4RRFFQ69G5FAV"
    refused = await served.reader.post(f"/api/runs/{missing}/cancel")
    assert refused.status_code == 403
    assert "read-only" in refused.json()["error"]["message"]
    reached = await served.client.post(f"/api/runs/{missing}/cancel")
    assert reached.status_code == 404


async def test_access_token_is_accepted_on_stream_routes_only(served: Served) -> None:
    """?access_token= authenticates /api/stream (an EventSource cannot send headers) and is
    refused (401) on any other route, even with the right token."""
    refused = await served.anonymous.get("/api/runs", params={"access_token": FULL_TOKEN})
    assert refused.status_code == 401
    assert "stream routes only" in refused.json()["error"]["message"]
    async with served.anonymous.stream(
        "GET", "/api/stream", params={"access_token": READ_TOKEN}
    ) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        first = await anext(stream.aiter_lines())
        assert first.startswith("retry:")


async def test_a_trusted_proxy_header_grants_read_or_full_by_user(
    start_serve: StartServe,
) -> None:
    """With TREADLE_SERVE_TRUSTED_HEADER, a request carrying it is authenticated: users in
    TREADLE_SERVE_TRUSTED_FULL_USERS act, others only read; without it: 401."""
    served = await start_serve(
        TREADLE_SERVE_TOKEN=None,
        TREADLE_SERVE_READONLY_TOKEN=None,
        TREADLE_SERVE_TRUSTED_HEADER="X-Forwarded-User",
        TREADLE_SERVE_TRUSTED_FULL_USERS="alice",
    )
    alice = served.client_for(headers={"X-Forwarded-User": "alice"})
    bob = served.client_for(headers={"X-Forwarded-User": "bob"})
    missing = "wrun_01ARZ3NDEKTSV4RRFFQ69G5FAV"
    assert (await bob.get("/api/runs")).status_code == 200
    assert (await bob.post(f"/api/runs/{missing}/wake")).status_code == 403
    assert (await alice.post(f"/api/runs/{missing}/wake")).status_code == 404
    anonymous = await served.anonymous.get("/api/runs")
    assert anonymous.status_code == 401
    assert "X-Forwarded-User" in anonymous.json()["error"]["message"]


async def test_public_routes_answer_without_credentials(served: Served) -> None:
    """/healthz and the webhooks' /hooks/* pass auth without credentials (what answers
    there is its module's); /api/* and anything else do not."""
    assert (await served.anonymous.get("/healthz")).status_code == 200
    hook = await served.anonymous.post("/hooks/some-token", json={})
    assert hook.status_code != 401
    assert (await served.anonymous.get("/api/openapi.json")).status_code == 401
    assert (await served.anonymous.get("/api/deployments")).status_code == 401


async def test_cors_is_closed_by_default_and_opened_by_the_setting(
    start_serve: StartServe,
) -> None:
    """No CORS headers unless TREADLE_SERVE_CORS_ORIGINS names the origin; then a
    preflight from it is allowed and another origin is not."""
    closed = await start_serve()
    answer = await closed.client.get("/api/runs", headers={"Origin": "https://ui.example"})
    assert "access-control-allow-origin" not in answer.headers
    opened = await start_serve(TREADLE_SERVE_CORS_ORIGINS="https://ui.example")
    preflight = await opened.anonymous.options(
        "/api/runs",
        headers={
            "Origin": "https://ui.example",
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "authorization",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://ui.example"
    other = await opened.client.get("/api/runs", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers


async def test_insecure_mode_gives_everyone_the_full_role(start_serve: StartServe) -> None:
    """--insecure-no-auth (no auth configured): requests without credentials are served."""
    served = await start_serve(
        insecure=True, TREADLE_SERVE_TOKEN=None, TREADLE_SERVE_READONLY_TOKEN=None
    )
    assert (await served.anonymous.get("/api/runs")).status_code == 200


def test_the_app_refuses_to_start_without_auth(tmp_path: object) -> None:
    """create_app with no token, no trusted header and not insecure: SettingsError naming
    the settings and --insecure-no-auth."""
    ctx = ServeContext(
        world=None,  # type: ignore[arg-type]
        settings=None,  # type: ignore[arg-type]
        serve=serve_settings.load({}),
    )
    with pytest.raises(errors.SettingsError, match=r"TREADLE_SERVE_TOKEN.*--insecure-no-auth"):
        create_app(ctx)


def test_bad_serve_settings_name_the_setting_never_the_token() -> None:
    """A short token, equal tokens, or a bad header name: one SettingsError naming the
    setting, without the token's value."""
    with pytest.raises(errors.SettingsError, match="TREADLE_SERVE_TOKEN must be at least") as e:
        serve_settings.load({"TREADLE_SERVE_TOKEN": "short-secret"})
    assert "short-secret" not in str(e.value)
    same = "s" * 32
    with pytest.raises(errors.SettingsError, match="must differ") as e:
        serve_settings.load({"TREADLE_SERVE_TOKEN": same, "TREADLE_SERVE_READONLY_TOKEN": same})
    assert same not in str(e.value)
    with pytest.raises(errors.SettingsError, match="TREADLE_SERVE_TRUSTED_HEADER"):
        serve_settings.load({"TREADLE_SERVE_TRUSTED_HEADER": "Authorization"})


async def test_insecure_mode_never_overrides_a_configured_token(start_serve: StartServe) -> None:
    """insecure with a token configured: the token is still asked (401 without it)."""
    served = await start_serve(insecure=True)
    assert (await served.anonymous.get("/api/runs")).status_code == 401
    assert (await served.client.get("/api/runs")).status_code == 200
