"""Webhooks over real HTTP: a POST resumes the run that waits on it (issue 13 item 1).

A real uvicorn server (``tests/serve/conftest.py``) runs ``create_app`` over a real
local World; the workflow makes its webhook with ``create_webhook()`` and the test
calls the URL with httpx, without credentials (the token is the credential).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

import pytest

from treadle import WebhookRequest, clock, errors, webhooksig
from treadle.serve import webhooklookup
from treadle.world import events

from .conftest import Served, StartServe
from .webhookharness import SECRET, SECRET_ENV, SERVE_LIMIT, Flows, log_of, register, waiting

LIMIT = 1024 * 1024  # TREADLE_WEBHOOK_MAX_BODY_BYTES's default
JSON = {"Content-Type": "application/json"}


@pytest.fixture
async def hooked(start_serve: StartServe, monkeypatch: pytest.MonkeyPatch) -> tuple[Served, Flows]:
    """serve on a local World, the test workflows on its app, the secret in serve's env."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    served = await start_serve(**SERVE_LIMIT)
    return served, register(served.app)


async def test_a_json_post_resumes_the_run_with_the_typed_request(
    hooked: tuple[Served, Flows],
) -> None:
    """The call's method, lower-cased headers, query, subpath and JSON body reach the run
    as a WebhookRequest; the caller (no credentials) gets the default 202."""
    served, flows = hooked
    run = await served.app.start("callback", "json")
    url = await flows.urls.get()
    # No TREADLE_PUBLIC_URL on this worker: the URL is the bare path.
    assert url.startswith(f"/hooks/{run.run_id}.hk_"), url
    answer = await served.anonymous.post(
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
    # The same URL on every replay: the announcing pass and the final one agree.
    assert out["url"] == out["announced"] == url


async def test_a_form_post_arrives_as_fields_and_gets_the_chosen_response(
    hooked: tuple[Served, Flows],
) -> None:
    """A urlencoded form becomes ``form`` (repeated fields kept); the webhook's
    ``respond_with`` (200, text, a header) is what the caller gets."""
    served, flows = hooked
    run = await served.app.start("callback", "text-reply")
    url = await flows.urls.get()
    answer = await served.anonymous.post(url, data={"event": "charge", "note": ["a", "b"]})
    assert answer.status_code == 200, answer.text
    assert answer.text == "ok" and answer.headers["x-reply"] == "yes"
    request = (await run.result(timeout=20))["request"]
    assert request["form"] == {"event": ["charge"], "note": ["a", "b"]}
    assert request["body"] is None


async def test_a_github_style_signature_is_checked_before_anything_is_recorded(
    hooked: tuple[Served, Flows],
) -> None:
    """A missing, unprefixed or wrong ``sha256=`` signature is 401 naming the problem and
    leaves the run's log as it was; the right one resumes the run."""
    served, flows = hooked
    run = await served.app.start("callback", "hmac")
    url = await flows.urls.get()
    before = await waiting(served.world, run.run_id)
    body = json.dumps({"action": "opened"}).encode()
    good = webhooksig.sign_hmac(SECRET, body)
    cases = {
        "missing": ({}, "is missing"),
        "no prefix": ({"X-Signature": good.removeprefix("sha256=")}, "does not start with"),
        "wrong secret": ({"X-Signature": webhooksig.sign_hmac("other", body)}, "does not match"),
        "other body": ({"X-Signature": webhooksig.sign_hmac(SECRET, body + b" ")}, "not match"),
    }
    for name, (headers, problem) in cases.items():
        answer = await served.anonymous.post(url, content=body, headers={**JSON, **headers})
        assert answer.status_code == 401, (name, answer.text)
        err = answer.json()["error"]
        assert err["code"] == "signature_invalid" and problem in err["message"], (name, err)
        assert SECRET not in answer.text
    assert await log_of(served.world, run.run_id) == before
    answer = await served.anonymous.post(url, content=body, headers={**JSON, "X-Signature": good})
    assert answer.status_code == 202, answer.text
    assert (await run.result(timeout=20))["request"]["body"] == {"action": "opened"}


async def test_a_stripe_style_signature_needs_a_fresh_timestamp(
    hooked: tuple[Served, Flows],
) -> None:
    """``t=...,v1=...``: a stale (correctly signed) timestamp, a forged v1 and a garbled
    header are 401 with nothing recorded; a fresh v1 after an old secret's resumes."""
    served, flows = hooked
    run = await served.app.start("callback", "stripe")
    url = await flows.urls.get()
    before = await waiting(served.world, run.run_id)
    body = b'{"type": "payment_intent.succeeded"}'
    now = int(clock.now())
    forged = webhooksig.sign_stripe("not-the-secret", body, now)
    for header, problem in (
        (webhooksig.sign_stripe(SECRET, body, now - 3600), "outside the tolerance of 300 s"),
        (forged, "no v1 signature"),
        ("v1=abc", "is not t=<unix seconds>,v1=<hex>"),
    ):
        answer = await served.anonymous.post(
            url, content=body, headers={**JSON, "Stripe-Signature": header}
        )
        assert answer.status_code == 401, (header, answer.text)
        assert problem in answer.json()["error"]["message"]
    assert await log_of(served.world, run.run_id) == before
    fresh = webhooksig.sign_stripe(SECRET, body, now)
    rolled = forged.split(",")[1] + "," + fresh  # an old secret's v1 first, then the new one
    answer = await served.anonymous.post(
        url, content=body, headers={**JSON, "Stripe-Signature": rolled}
    )
    assert answer.status_code == 202, answer.text
    out = await run.result(timeout=20)
    assert out["request"]["body"] == {"type": "payment_intent.succeeded"}


async def test_an_over_size_body_is_413_and_records_nothing(hooked: tuple[Served, Flows]) -> None:
    """Over TREADLE_WEBHOOK_MAX_BODY_BYTES: refused from Content-Length, and from the
    stream when the body is chunked (no Content-Length); the run's log is unchanged."""
    served, flows = hooked
    run = await served.app.start("callback", "json")
    url = await flows.urls.get()
    before = await waiting(served.world, run.run_id)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(LIMIT // 65536 + 2):
            yield b"x" * 65536

    declared = await served.anonymous.post(url, content=b"y" * (LIMIT + 1))
    streamed = await served.anonymous.post(url, content=chunks())
    assert "content-length" not in streamed.request.headers
    for answer in (declared, streamed):
        assert answer.status_code == 413, answer.text
        err = answer.json()["error"]
        assert err["code"] == "body_too_large", err
        assert "TREADLE_WEBHOOK_MAX_BODY_BYTES" in err["message"]
    assert await log_of(served.world, run.run_id) == before
    assert await run.status() == "running"
    at_limit = await served.anonymous.post(url, content=b"z" * LIMIT)
    assert at_limit.status_code == 202, at_limit.text


async def test_unknown_gone_repeated_and_non_post_calls(hooked: tuple[Served, Flows]) -> None:
    """404 for a URL no webhook has (a made-up token, another run's id, a plain
    create_hook hook, no token at all) or whose run ended, 405 for GET, 409 for a second
    call after the payload was taken (one hook_received in the log)."""
    served, flows = hooked
    http = served.anonymous
    run = await served.app.start("callback", "json")
    url = await flows.urls.get()
    plain = await served.app.start("plain")
    plain_token = await flows.urls.get()
    token = url.rsplit(".", 1)[1]
    for wrong in (
        f"/hooks/{run.run_id}.hk_{'0' * 32}",
        f"/hooks/{plain.run_id}.{token}",
        f"/hooks/{plain.run_id}.{plain_token}",
        "/hooks/nothing-like-a-token",
    ):
        answer = await http.post(wrong, json={})
        assert answer.status_code == 404, (wrong, answer.text)
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
    received = [e for e in await log_of(served.world, run.run_id) if e.type == "hook_received"]
    assert len(received) == 1
    # A run that ended while it waited: its webhook is gone (404, not 409).
    ended = await served.app.start("callback", "json")
    ended_url = await flows.urls.get()
    await waiting(served.world, ended.run_id)
    await ended.cancel()
    gone = await http.post(ended_url, json={})
    assert gone.status_code == 404, gone.text
    assert gone.json()["error"]["code"] == "hook_not_found"


async def test_malformed_json_and_multipart_are_refused_with_nothing_recorded(
    hooked: tuple[Served, Flows],
) -> None:
    served, flows = hooked
    run = await served.app.start("callback", "json")
    url = await flows.urls.get()
    before = await waiting(served.world, run.run_id)
    answer = await served.anonymous.post(url, content=b"{not json", headers=JSON)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "request_invalid"
    assert "not valid JSON" in answer.json()["error"]["message"]
    multipart = await served.anonymous.post(url, files={"f": ("a.txt", b"hi")})
    assert multipart.status_code == 415, multipart.text
    assert await log_of(served.world, run.run_id) == before


async def test_a_webhook_that_timed_out_is_gone(hooked: tuple[Served, Flows]) -> None:
    """``request(timeout=...)`` returns None when nobody calls in time and the webhook
    goes (disposed; here the run ends too): a late call is 404, not 409, and records
    nothing."""
    served, flows = hooked
    run = await served.app.start("expiring", 0.3)
    url = await flows.urls.get()
    assert await run.result(timeout=20) is None
    before = await log_of(served.world, run.run_id)
    assert "hook_received" not in [e.type for e in before]
    late = await served.anonymous.post(url, json={"late": True})
    assert late.status_code == 404, late.text
    assert await log_of(served.world, run.run_id) == before


async def test_two_concurrent_calls_take_one_payload(hooked: tuple[Served, Flows]) -> None:
    """Two calls at once, however they interleave (the loser finds the hook gone, or
    loses the write after finding it live): one 202, one 409, one hook_received."""
    served, flows = hooked
    run = await served.app.start("callback", "json")
    url = await flows.urls.get()
    await waiting(served.world, run.run_id)
    answers = await asyncio.gather(*(served.anonymous.post(url, json={"n": n}) for n in range(2)))
    assert sorted(a.status_code for a in answers) == [202, 409], [a.text for a in answers]
    winner = next(n for n, a in enumerate(answers) if a.status_code == 202)
    assert (await run.result(timeout=20))["request"]["body"] == {"n": winner}
    received = [e for e in await log_of(served.world, run.run_id) if e.type == "hook_received"]
    assert len(received) == 1


async def test_a_hand_resume_with_a_body_reaches_the_workflow(
    hooked: tuple[Served, Flows],
) -> None:
    """A callback the sender lost can be given by hand: ``resume_hook(token, {"body":
    ...})`` is a WebhookRequest with that body and no received_at."""
    served, flows = hooked
    run = await served.app.start("callback", "json")
    await flows.urls.get()
    token = next(
        e.event.token
        for e in await waiting(served.world, run.run_id)
        if isinstance(e.event, events.HookCreated)
    )
    await served.ctx.client.resume_hook(token, {"body": {"status": "paid"}})
    request = (await run.result(timeout=20))["request"]
    assert request["body"] == {"status": "paid"} and request["received_at"] is None


async def test_log_lines_name_the_run_and_never_the_whole_token(
    hooked: tuple[Served, Flows], caplog: pytest.LogCaptureFixture
) -> None:
    """The token is the URL's secret: serve's log lines for an accepted call and for
    refusals (401, 409, 404) carry the run id and only the token's first characters."""
    served, flows = hooked
    caplog.set_level(logging.INFO, logger="treadle.serve.webhooks")
    run = await served.app.start("callback", "hmac")
    url = await flows.urls.get()
    token = url.rsplit(".", 1)[1]
    body = b"{}"
    bad = await served.anonymous.post(url, content=body, headers={"X-Signature": "sha256=00"})
    good = await served.anonymous.post(
        url, content=body, headers={"X-Signature": webhooksig.sign_hmac(SECRET, body)}
    )
    again = await served.anonymous.post(url, content=body)
    assert [bad.status_code, good.status_code, again.status_code] == [401, 202, 409]
    await run.result(timeout=20)
    made_up = "hk_" + "0" * 32
    gone = await served.anonymous.post(f"/hooks/{run.run_id}.{made_up}", content=body)
    assert gone.status_code == 404
    lines = [r.getMessage() for r in caplog.records if r.name == "treadle.serve.webhooks"]
    assert len(lines) >= 4 and all(run.run_id in line for line in lines), lines
    assert not any(token in line or made_up in line for line in lines), lines
    assert token not in bad.text + again.text + gone.text


async def test_the_read_only_api_never_shows_a_webhooks_token_from_its_hook(
    hooked: tuple[Served, Flows],
) -> None:
    """The hook's metadata holds the URL's base, never the URL, so the read-only role's
    view of ``hook_created`` (token hidden by the API) cannot be turned into a call.
    (Where the workflow itself puts the URL, a step's arguments here, readers see it:
    docs/webhooks.md says so and recommends a signature.)"""
    served, flows = hooked
    run = await served.app.start("callback", "json")
    url = await flows.urls.get()
    token = url.rsplit(".", 1)[1]
    logged = await waiting(served.world, run.run_id)
    created = next(e.event for e in logged if isinstance(e.event, events.HookCreated))
    assert token not in json.dumps(created.metadata), created.metadata
    page = await served.reader.get(f"/api/runs/{run.run_id}/events")
    assert page.status_code == 200, page.text
    hooks = [e for e in page.json()["events"] if e["type"] == "hook_created"]
    assert len(hooks) == 1 and token not in json.dumps(hooks), hooks
    assert hooks[0]["event"]["metadata"]["treadle.webhook"]["base_url"] == ""


async def test_the_loser_of_the_write_is_told_the_payload_was_taken(
    hooked: tuple[Served, Flows],
) -> None:
    """The race's second half, step by step: a call that looked the hook up live, then
    lost the write to another, gets HookNotFound from the World, and the run's log
    turns it into WebhookAlreadyReceived (what serve answers 409)."""
    served, flows = hooked
    run = await served.app.start("callback", "json")
    token = (await flows.urls.get()).rsplit(".", 1)[1]
    await waiting(served.world, run.run_id)
    hook = await webhooklookup.find_live(served.world, run.run_id, token, None)
    await served.ctx.client.resume_found_hook(token, hook, WebhookRequest(body={"n": 1}))
    with pytest.raises(errors.HookNotFound):
        await served.ctx.client.resume_found_hook(token, hook, WebhookRequest(body={"n": 2}))
    found = await webhooklookup.state_in_log(served.world, run.run_id, token)
    assert found.state == "received"
    refusal = webhooklookup.refusal(found, token, run.run_id)
    assert isinstance(refusal, errors.WebhookAlreadyReceived)
    assert (await run.result(timeout=20))["request"]["body"] == {"n": 1}
