"""The JSON API's reads (issue 13 item 1): the runs list with filters, search and cursor
paging, one run with what it waits on, its events, its timeline, the deployments."""

from __future__ import annotations

from .conftest import Served
from .flows import define, wait_for_event


async def test_runs_list_filters_by_status_and_workflow_and_pages_with_a_cursor(
    served: Served,
) -> None:
    """Five runs of two workflows: filters narrow them; limit=2 pages through each once."""
    flows = define(served.app)
    done = [await served.app.start(flows.hi, f"n{i}") for i in range(3)]
    failed = [await served.app.start(flows.fails) for _ in range(2)]
    for run in done:
        await run.result(timeout=15)
    for run in failed:
        await wait_for_event(served.world, run.run_id, "run_failed")
    everything = (await served.client.get("/api/runs")).json()
    assert {r["run_id"] for r in everything["runs"]} == {r.run_id for r in done + failed}
    assert everything["next_cursor"] is None
    by_status = (await served.client.get("/api/runs", params={"status": "failed"})).json()
    assert {r["run_id"] for r in by_status["runs"]} == {r.run_id for r in failed}
    by_name = (await served.client.get("/api/runs", params={"workflow": "hi"})).json()
    assert {r["run_id"] for r in by_name["runs"]} == {r.run_id for r in done}
    assert all(r["status"] == "completed" and r["duration_ms"] >= 0 for r in by_name["runs"])
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = (await served.client.get("/api/runs", params=params)).json()
        assert len(page["runs"]) <= 2
        seen += [r["run_id"] for r in page["runs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == 5
    assert set(seen) == {r.run_id for r in done + failed}


async def test_runs_search_finds_by_run_id_and_by_workflow_text_and_pages(
    served: Served,
) -> None:
    """q= a run id finds that run; q= text matches workflow names (run ids have no I),
    paged without repeats."""
    flows = define(served.app)
    his = [await served.app.start(flows.hi, f"n{i}") for i in range(3)]
    other = await served.app.start(flows.fails)
    for run in his:
        await run.result(timeout=15)
    one = (await served.client.get("/api/runs", params={"q": other.run_id})).json()
    assert [r["run_id"] for r in one["runs"]] == [other.run_id]
    seen: list[str] = []
    cursor = None
    for _ in range(5):
        params = {"q": "hi", "limit": "2", **({"cursor": cursor} if cursor else {})}
        page = (await served.client.get("/api/runs", params=params)).json()
        seen += [r["run_id"] for r in page["runs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(r.run_id for r in his)
    nothing = (await served.client.get("/api/runs", params={"q": "no-such-thing"})).json()
    assert nothing == {"runs": [], "next_cursor": None}


async def test_run_detail_shows_input_output_and_what_a_run_waits_on(served: Served) -> None:
    """A run on a hook lists the hook under waiting_on (token shown to the full role,
    hidden from the read-only one); a completed run shows its output and no waits."""
    flows = define(served.app)
    waiting = await served.app.start(flows.approve, "tok-detail-1")
    await wait_for_event(served.world, waiting.run_id, "hook_created")
    detail = (await served.client.get(f"/api/runs/{waiting.run_id}")).json()
    assert detail["status"] == "running"
    assert detail["workflow"] == "approve"
    assert detail["spec_version"] == 9
    assert [w["kind"] for w in detail["waiting_on"]] == ["hook"]
    assert detail["waiting_on"][0]["token"] == "tok-detail-1"
    read = (await served.reader.get(f"/api/runs/{waiting.run_id}")).json()
    assert read["waiting_on"][0]["token"] == "<hidden>"
    done = await served.app.start(flows.hi, "ada")
    await done.result(timeout=15)
    finished = (await served.client.get(f"/api/runs/{done.run_id}")).json()
    assert finished["output"] == "hi ada"
    assert finished["waiting_on"] == []
    assert finished["ended_at"] is not None
    assert finished["event_count"] >= 4


async def test_run_events_page_by_slot(served: Served) -> None:
    """events?after=&limit= pages the log in slot order; the last page has no cursor."""
    flows = define(served.app)
    run = await served.app.start(flows.hi, "bo")
    await run.result(timeout=15)
    first = (await served.client.get(f"/api/runs/{run.run_id}/events", params={"limit": 2})).json()
    assert [e["slot"] for e in first["events"]] == [1, 2]
    assert first["events"][0]["type"] == "run_created"
    assert first["next_cursor"] == 2
    rest = (await served.client.get(f"/api/runs/{run.run_id}/events", params={"after": 2})).json()
    types = [e["type"] for e in rest["events"]]
    assert types[-1] == "run_completed"
    assert rest["next_cursor"] is None
    assert all(e["slot"] > 2 for e in rest["events"])


async def test_timeline_shows_a_retried_step_with_its_attempts(served: Served) -> None:
    """A step that failed once then passed is one bar with two attempts (retrying,
    completed); the run's start and end bound it."""
    flows = define(served.app)
    run = await served.app.start(flows.flaky, "k1")
    assert await run.result(timeout=15) == "steady"
    timeline = (await served.client.get(f"/api/runs/{run.run_id}/timeline")).json()
    assert timeline["status"] == "completed"
    [bar] = timeline["bars"]
    assert bar["kind"] == "step"
    assert bar["name"] == "wobbly"
    assert bar["status"] == "completed"
    assert [a["outcome"] for a in bar["attempts"]] == ["retrying", "completed"]
    assert bar["attempts"][0]["error"].endswith("not yet")
    assert timeline["refusals"] == 0
    assert bar["start"] <= bar["end"] <= timeline["end"]


async def test_timeline_shows_a_sleep_as_a_wait_bar(served: Served) -> None:
    """A sleeping run's timeline has an open wait bar (no end), status waiting."""
    flows = define(served.app)
    run = await served.app.start(flows.nap)
    await wait_for_event(served.world, run.run_id, "wait_created")
    timeline = (await served.client.get(f"/api/runs/{run.run_id}/timeline")).json()
    [bar] = timeline["bars"]
    assert (bar["kind"], bar["status"], bar["end"]) == ("wait", "waiting", None)
    waits = (await served.client.get(f"/api/runs/{run.run_id}")).json()["waiting_on"]
    assert waits[0]["kind"] == "wait"
    assert waits[0]["until"] is not None


async def test_deployments_list_their_revisions_the_latest_and_the_retired(
    served: Served,
) -> None:
    """Registered deployments are listed newest first with latest/retired marked and
    grouped by WorkflowDeployment name (the operator's <name>-<6 hex> revisions)."""
    deployments = served.world.deployments
    await deployments.register("orders-aaaaaa", catalogue={"checkout": {"params": []}})
    await deployments.register("orders-bbbbbb", catalogue={"checkout": {"params": []}})
    await deployments.retire("orders-aaaaaa")
    await deployments.promote("orders-bbbbbb")
    body = (await served.client.get("/api/deployments")).json()
    assert body["latest"] == "orders-bbbbbb"
    by_id = {d["deployment_id"]: d for d in body["deployments"]}
    assert by_id["orders-bbbbbb"]["latest"] is True
    assert by_id["orders-bbbbbb"]["workflows"] == ["checkout"]
    assert by_id["orders-aaaaaa"]["retired"] is True
    groups = {g["name"]: g for g in body["revisions"]}
    assert groups["orders"]["revisions"] == ["orders-bbbbbb", "orders-aaaaaa"]
    assert groups["orders"]["latest"] == "orders-bbbbbb"
