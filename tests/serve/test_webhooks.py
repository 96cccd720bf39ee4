"""Webhooks over real HTTP: a POST resumes the run that waits on it (issue 13 item 1).

A real uvicorn server runs ``create_app`` over a real local World; the workflow makes
its webhook with ``create_webhook()`` and the test calls the URL with httpx.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from treadle import clock, webhooksig
from treadle.worlds.local import LocalWorld

from .webhookharness import (
    SECRET,
    SECRET_ENV,
    WebhookApp,
    client,
    log_of,
    serving,
    waiting,
    webhook_app,
)


@pytest.fixture
async def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[WebhookApp]:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    world = await LocalWorld(tmp_path / "world").open()
    try:
        async with serving(world, TREADLE_WEBHOOK_MAX_BODY_BYTES=4096) as base:
            made = webhook_app(world, base)
            try:
                yield made
            finally:
                await made.app.close(grace_seconds=2)
    finally:
        await world.close()


async def test_a_json_post_resumes_the_run_with_the_typed_request(served: WebhookApp) -> None:
    """The call's method, lower-cased headers, query, subpath and JSON body reach the run;
    the caller gets the default 202 {"accepted": true}."""
    made = served
    run = await made.app.start("callback", "json")
    url = await made.urls.get()
    assert url.startswith("http://127.0.0.1:") and f"/hooks/{run.run_id}.hk_" in url
    async with client() as http:
        answer = await http.post(
            url + "/stripe/events?order=42&tag=a&tag=b",
            json={"status": "paid", "amount": 1200},
            headers={"X-Request-Id": "abc", "Authorization": "Basic dXNlcjpwdw=="},
        )
    assert answer.status_code == 202, answer.text
    assert answer.json() == {"accepted": True}
    out = await run.result(timeout=20)
    request = out["request"]
    assert request["method"] == "POST"
    assert request["path"] == "/stripe/events"
    assert request["body"] == {"status": "paid", "amount": 1200}
    assert request["form"] is None and request["text"] is None
    assert request["query"] == {"order": ["42"], "tag": ["a", "b"]}
    assert request["headers"]["x-request-id"] == "abc"
    assert request["headers"]["authorization"] == "Basic dXNlcjpwdw=="  # kept, as documented
    assert request["content_type"] == "application/json"
    assert request["received_at"]
    # The URL is the same on every replay: the announcing pass and the final one agree.
    assert out["url"] == out["announced"] == url


async def test_a_form_post_arrives_as_fields_and_gets_the_chosen_response(
    served: WebhookApp,
) -> None:
    made = served
    run = await made.app.start("callback", "text-reply")
    url = await made.urls.get()
    async with client() as http:
        answer = await http.post(url, data={"event": "charge", "note": ["a", "b"]})
    assert answer.status_code == 200, answer.text
    assert answer.text == "ok" and answer.headers["x-reply"] == "yes"
    request = (await run.result(timeout=20))["request"]
    assert request["form"] == {"event": ["charge"], "note": ["a", "b"]}
    assert request["body"] is None


async def test_a_github_style_signature_is_checked_before_anything_is_recorded(
    served: WebhookApp,
) -> None:
    """A missing, malformed or wrong ``sha256=`` signature is 401 naming the problem and
    leaves the run's log as it was; the right one resumes the run."""
    made = served
    world = made.world
    run = await made.app.start("callback", "hmac")
    url = await made.urls.get()
    before = await waiting(world, run.run_id)
    body = json.dumps({"action": "opened"}).encode()
    good = webhooksig.sign_hmac(SECRET, body)
    cases = {
        "missing": ({}, "is missing"),
        "no prefix": ({"X-Signature": good.removeprefix("sha256=")}, "does not start with"),
        "wrong secret": ({"X-Signature": webhooksig.sign_hmac("other", body)}, "does not match"),
        "other body": (
            {"X-Signature": webhooksig.sign_hmac(SECRET, body + b" ")},
            "does not match",
        ),
    }
    async with client() as http:
        for name, (headers, problem) in cases.items():
            answer = await http.post(
                url, content=body, headers={"Content-Type": "application/json", **headers}
            )
            assert answer.status_code == 401, (name, answer.text)
            err = answer.json()["error"]
            assert err["code"] == "signature_invalid" and problem in err["message"], (name, err)
            assert SECRET not in answer.text
        assert await log_of(world, run.run_id) == before
        answer = await http.post(
            url, content=body, headers={"Content-Type": "application/json", "X-Signature": good}
        )
    assert answer.status_code == 202, answer.text
    assert (await run.result(timeout=20))["request"]["body"] == {"action": "opened"}


async def test_a_stripe_style_signature_needs_a_fresh_timestamp(served: WebhookApp) -> None:
    """``t=...,v1=...``: a forged v1 and a stale (but correctly signed) timestamp are 401
    with nothing recorded; a fresh one, among a rolled-out old v1, resumes the run."""
    made = served
    world = made.world
    run = await made.app.start("callback", "stripe")
    url = await made.urls.get()
    before = await waiting(world, run.run_id)
    body = b'{"type": "payment_intent.succeeded"}'
    now = int(clock.now())
    stale = webhooksig.sign_stripe(SECRET, body, now - 3600)
    forged = webhooksig.sign_stripe("not-the-secret", body, now)
    garbled = "v1=abc"
    async with client() as http:
        for header, problem in (
            (stale, "outside the tolerance of 300 s"),
            (forged, "no v1 signature"),
            (garbled, "is not t=<unix seconds>,v1=<hex>"),
        ):
            answer = await http.post(
                url,
                content=body,
                headers={"Content-Type": "application/json", "Stripe-Signature": header},
            )
            assert answer.status_code == 401, (header, answer.text)
            assert problem in answer.json()["error"]["message"]
        assert await log_of(world, run.run_id) == before
        fresh = webhooksig.sign_stripe(SECRET, body, now)
        rolled = forged.split(",")[1] + "," + fresh  # an old secret's v1 first
        answer = await http.post(
            url,
            content=body,
            headers={"Content-Type": "application/json", "Stripe-Signature": rolled},
        )
    assert answer.status_code == 202, answer.text
    out = await run.result(timeout=20)
    assert out["request"]["body"] == {"type": "payment_intent.succeeded"}


async def test_an_over_size_body_is_413_and_records_nothing(served: WebhookApp) -> None:
    """Over TREADLE_WEBHOOK_MAX_BODY_BYTES (4096 here): refused from Content-Length, and
    from the stream when the body is chunked (no Content-Length); the log is unchanged."""
    made = served
    world = made.world
    run = await made.app.start("callback", "json")
    url = await made.urls.get()
    before = await waiting(world, run.run_id)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 1000

    async with client() as http:
        declared = await http.post(url, content=b"y" * 5000)
        streamed = await http.post(url, content=chunks())
        assert "content-length" not in streamed.request.headers
    for answer in (declared, streamed):
        assert answer.status_code == 413, answer.text
        err = answer.json()["error"]
        assert (
            err["code"] == "body_too_large" and "TREADLE_WEBHOOK_MAX_BODY_BYTES" in err["message"]
        )
    assert await log_of(world, run.run_id) == before
    assert await run.status() == "running"


async def test_unknown_gone_repeated_and_non_post_calls(served: WebhookApp) -> None:
    """404 for a URL no webhook has (a made-up token, another run's id, a plain
    create_hook hook), 405 for GET, 409 for a second call after the payload was taken."""
    made = served
    world = made.world
    run = await made.app.start("callback", "json")
    url = await made.urls.get()
    plain = await made.app.start("plain")
    plain_token = await made.urls.get()
    base = url.split("/hooks/")[0]
    token_part = url.rsplit(".", 1)[1]
    async with client() as http:
        made_up = await http.post(f"{base}/hooks/{run.run_id}.hk_{'0' * 32}", json={})
        other_run = await http.post(f"{base}/hooks/{plain.run_id}.{token_part}", json={})
        not_a_webhook = await http.post(f"{base}/hooks/{plain.run_id}.{plain_token}", json={})
        garbage = await http.post(f"{base}/hooks/nothing-like-a-token", json={})
        for answer in (made_up, other_run, not_a_webhook, garbage):
            assert answer.status_code == 404, answer.text
            assert answer.json()["error"]["code"] == "hook_not_found"
        got = await http.get(url)
        assert got.status_code == 405 and got.headers["allow"] == "POST"
        assert got.json()["error"]["code"] == "method_not_allowed"
        first = await http.post(url, json={"n": 1})
        assert first.status_code == 202
        second = await http.post(url, json={"n": 2})
    assert second.status_code == 409, second.text
    assert second.json()["error"]["code"] == "hook_already_received"
    assert (await run.result(timeout=20))["request"]["body"] == {"n": 1}
    received = [e for e in await log_of(world, run.run_id) if e.type == "hook_received"]
    assert len(received) == 1


async def test_malformed_json_is_400_with_nothing_recorded(served: WebhookApp) -> None:
    made = served
    world = made.world
    run = await made.app.start("callback", "json")
    url = await made.urls.get()
    before = await waiting(world, run.run_id)
    async with client() as http:
        answer = await http.post(
            url, content=b"{not json", headers={"Content-Type": "application/json"}
        )
        multipart = await http.post(url, files={"f": ("a.txt", b"hi")})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "request_invalid"
    assert "not valid JSON" in answer.json()["error"]["message"]
    assert multipart.status_code == 415
    assert await log_of(world, run.run_id) == before
