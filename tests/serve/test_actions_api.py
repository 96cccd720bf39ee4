"""The JSON API's actions (issue 13 item 1): cancel, wake, rerun with the same input,
resume a hook by token; each as the CLI's client writes it, refused on an ended run."""

from __future__ import annotations

from .conftest import Served, StartServe
from .flows import define, wait_for_event


async def test_cancel_ends_a_running_run_and_a_second_cancel_is_409(served: Served) -> None:
    """POST cancel writes run_cancelled (with the reason); the run is cancelled; cancelling
    it again is 409 run_ended."""
    flows = define(served.app)
    run = await served.app.start(flows.nap)
    await wait_for_event(served.world, run.run_id, "wait_created")
    response = await served.client.post(
        f"/api/runs/{run.run_id}/cancel", json={"reason": "from the API"}
    )
    assert response.status_code == 200, response.text
    assert response.json() == {"run_id": run.run_id, "status": "cancelled", "waits": None}
    cancelled = await wait_for_event(served.world, run.run_id, "run_cancelled")
    assert cancelled.event.reason == "from the API"  # type: ignore[union-attr]
    again = await served.client.post(f"/api/runs/{run.run_id}/cancel")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "run_ended"


async def test_wake_ends_a_sleep_now_and_the_run_completes(served: Served) -> None:
    """POST wake on a run sleeping an hour asks its one sleep to end; the run completes."""
    flows = define(served.app)
    run = await served.app.start(flows.nap)
    await wait_for_event(served.world, run.run_id, "wait_created")
    response = await served.client.post(f"/api/runs/{run.run_id}/wake", json={})
    assert response.status_code == 200, response.text
    assert response.json()["waits"] == 1
    assert await run.result(timeout=15) == "rested"
    ended = await served.client.post(f"/api/runs/{run.run_id}/wake")
    assert ended.status_code == 409


async def test_rerun_starts_a_new_run_with_the_same_input_once_per_idempotency_key(
    served: Served,
) -> None:
    """POST rerun of a finished run: 201, a new run of the same workflow and input, marked
    rerun_of; the same Idempotency-Key again names the same run; a live run is 409."""
    flows = define(served.app)
    first = await served.app.start(flows.hi, "grace")
    await first.result(timeout=15)
    headers = {"Idempotency-Key": "retry-1"}
    response = await served.client.post(f"/api/runs/{first.run_id}/rerun", headers=headers)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["rerun_of"] == first.run_id
    assert body["workflow"] == "hi"
    assert body["run_id"] != first.run_id
    assert await served.app.get_run(body["run_id"]).result(timeout=15) == "hi grace"
    again = await served.client.post(f"/api/runs/{first.run_id}/rerun", headers=headers)
    assert again.status_code == 201
    assert again.json()["run_id"] == body["run_id"]
    rerun = await served.world.runs.get(body["run_id"])
    original = await served.world.runs.get(first.run_id)
    assert rerun.input == original.input
    assert rerun.attributes == {"rerun_of": first.run_id}
    live = await served.app.start(flows.nap)
    await wait_for_event(served.world, live.run_id, "wait_created")
    refused = await served.client.post(f"/api/runs/{live.run_id}/rerun")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "run_active"


async def test_resume_hook_by_token_delivers_the_payload_and_a_second_is_404(
    served: Served,
) -> None:
    """POST /api/hooks/{token}/resume: 202 with the run id; the run completes with the
    payload; the hook is gone after it, so resuming again is 404 hook_not_found."""
    flows = define(served.app)
    run = await served.app.start(flows.approve, "tok-resume-1")
    await wait_for_event(served.world, run.run_id, "hook_created")
    response = await served.client.post(
        "/api/hooks/tok-resume-1/resume", json={"payload": {"approved": True}}
    )
    assert response.status_code == 202, response.text
    assert response.json() == {"run_id": run.run_id}
    assert await run.result(timeout=15) is True
    again = await served.client.post("/api/hooks/tok-resume-1/resume", json={"payload": {}})
    assert again.status_code == 404
    assert again.json()["error"]["code"] == "hook_not_found"


async def test_actions_work_on_postgres_and_nats(served_pg: Served) -> None:
    """The API over Postgres + NATS: a hook resumed, a sleeper woken, both complete, and
    the list shows them completed."""
    flows = define(served_pg.app)
    hooked = await served_pg.app.start(flows.approve, "tok-pg-1")
    sleeper = await served_pg.app.start(flows.nap)
    await wait_for_event(served_pg.world, hooked.run_id, "hook_created")
    await wait_for_event(served_pg.world, sleeper.run_id, "wait_created")
    resumed = await served_pg.client.post(
        "/api/hooks/tok-pg-1/resume", json={"payload": {"approved": False}}
    )
    assert resumed.status_code == 202, resumed.text
    woken = await served_pg.client.post(f"/api/runs/{sleeper.run_id}/wake")
    assert woken.status_code == 200, woken.text
    assert await hooked.result(timeout=20) is False
    assert await sleeper.result(timeout=20) == "rested"
    listed = (await served_pg.client.get("/api/runs", params={"status": "completed"})).json()
    assert {r["run_id"] for r in listed["runs"]} == {hooked.run_id, sleeper.run_id}
    detail = (await served_pg.client.get(f"/api/runs/{sleeper.run_id}/timeline")).json()
    assert [b["kind"] for b in detail["bars"]] == ["wait"]


async def test_read_only_role_may_read_but_not_act(start_serve: StartServe) -> None:
    """The read-only token lists runs (200) and is refused every action (403 read_only),
    nothing written."""
    served = await start_serve()
    flows = define(served.app)
    run = await served.app.start(flows.nap)
    await wait_for_event(served.world, run.run_id, "wait_created")
    assert (await served.reader.get("/api/runs")).status_code == 200
    for action in ("cancel", "wake", "rerun"):
        refused = await served.reader.post(f"/api/runs/{run.run_id}/{action}")
        assert refused.status_code == 403, action
        assert refused.json()["error"]["code"] == "read_only"
    assert (await served.world.runs.get(run.run_id)).status == "running"
