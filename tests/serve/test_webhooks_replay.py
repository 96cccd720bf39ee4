"""Webhook URLs under replay and on Postgres + NATS (issue 13 item 1).

The URL is recorded with the hook (its token is minted once and taken from the log,
its base is kept in the hook's metadata), so a replay on another worker, even one
with another TREADLE_PUBLIC_URL, gives the URL the caller was handed.
"""

from __future__ import annotations

from treadle import Workflows, settings
from treadle.world import events

from ..production.conftest import ProductionHarness
from .conftest import FAST, StartServe
from .webhookharness import log_of, register, waiting

ELSEWHERE = "https://hooks.example.test/treadle"


async def test_a_replay_on_a_new_worker_keeps_the_url_it_handed_out(
    start_serve: StartServe,
) -> None:
    """The first worker (no TREADLE_PUBLIC_URL) hands out a bare-path URL and stops; a
    second worker with TREADLE_PUBLIC_URL set replays the run after the call and its
    ``hook.url`` is still the first one. New webhooks on the second get its base."""
    served = await start_serve()
    first = register(served.app)
    run = await served.app.start("callback", "json")
    url = await first.urls.get()
    await waiting(served.world, run.run_id)
    await served.app.close(grace_seconds=2)  # the first worker stops; the run waits on

    tuned = settings.load({}, **{**FAST, "TREADLE_PUBLIC_URL": ELSEWHERE})
    second = Workflows(world=served.world, settings_=tuned, worker=True)
    flows = register(second)
    try:
        await second.world()  # its worker takes the run's deliveries from here on
        answer = await served.anonymous.post(url, json={"ok": True})
        assert answer.status_code == 202, answer.text
        out = await second.get_run(run.run_id).result(timeout=20)
        assert out["url"] == out["announced"] == url
        assert url.startswith(f"/hooks/{run.run_id}.hk_"), url
        # A webhook made on the second worker is under its TREADLE_PUBLIC_URL.
        fresh = await second.start("callback", "json")
        fresh_url = await flows.urls.get()
        assert fresh_url.startswith(f"{ELSEWHERE}/hooks/{fresh.run_id}.hk_"), fresh_url
        answer = await served.anonymous.post(fresh_url.removeprefix(ELSEWHERE), json={"n": 2})
        assert answer.status_code == 202, answer.text
        assert (await fresh.result(timeout=20))["url"] == fresh_url
    finally:
        await second.close(grace_seconds=2)


async def test_a_webhook_resumes_a_run_on_postgres_and_nats(
    start_serve: StartServe, pg_world: ProductionHarness
) -> None:
    """The production World: a JSON call resumes the run, a second call is 409."""
    served = await start_serve(pg_world)
    flows = register(served.app)
    run = await served.app.start("callback", "json")
    url = await flows.urls.get()
    answer = await served.anonymous.post(url, json={"paid": True}, headers={"X-Id": "7"})
    assert answer.status_code == 202, answer.text
    out = await run.result(timeout=30)
    assert out["request"]["body"] == {"paid": True}
    assert out["request"]["headers"]["x-id"] == "7"
    again = await served.anonymous.post(url, json={"paid": True})
    assert again.status_code == 409, again.text
    assert [e.type for e in await log_of(served.world, run.run_id)].count("hook_received") == 1


async def test_serve_finds_a_webhook_stored_under_another_namespace(
    start_serve: StartServe,
) -> None:
    """A worker with TREADLE_HOOK_TOKEN_NAMESPACE=shop stores ``shop/hk_...``; serve
    (no namespace) takes the URL's bare token, finds the stored one in the run's log,
    and resumes it; a second call is still 409."""
    served = await start_serve()
    await served.app.close(grace_seconds=2)  # this test's worker is the namespaced one
    tuned = settings.load({}, **{**FAST, "TREADLE_HOOK_TOKEN_NAMESPACE": "shop"})
    shop = Workflows(world=served.world, settings_=tuned, worker=True)
    flows = register(shop)
    try:
        run = await shop.start("callback", "json")
        url = await flows.urls.get()
        logged = await log_of(served.world, run.run_id)
        created = [e.event for e in logged if isinstance(e.event, events.HookCreated)]
        assert created and created[0].token.startswith("shop/hk_"), created
        answer = await served.anonymous.post(url, json={"ns": "shop"})
        assert answer.status_code == 202, answer.text
        assert (await run.result(timeout=20))["request"]["body"] == {"ns": "shop"}
        again = await served.anonymous.post(url, json={})
        assert again.status_code == 409, again.text
    finally:
        await shop.close(grace_seconds=2)
