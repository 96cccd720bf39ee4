"""``start``, ``runs list/get/cancel``, ``inspect`` and ``settings``: the World without a worker."""

from __future__ import annotations

import json

from tests.cli.conftest import Cli, one_error_line

EVENT_FIELDS = {
    "slot",
    "created_at",
    "type",
    "correlation_id",
    "step_name",
    "attempt",
    "in_band",
    "event",
}


def test_start_records_a_pending_run_that_can_be_listed_read_and_cancelled(cli: Cli) -> None:
    started = cli.json("start", "flows.py:hi", "--input", '{"name": "queued"}')
    run_id = started["run_id"]
    assert started == {"run_id": run_id, "workflow": "hi", "status": "pending"}
    assert cli("start", "flows.py:hi", "--input", '["plain"]').stdout.startswith("wrun_")

    listed = cli.json("runs", "list", "--workflow", "hi", "--status", "pending")
    assert [r["status"] for r in listed] == ["pending", "pending"]
    assert listed[1]["run_id"] == run_id  # newest first
    assert listed[1]["input"] == {"args": [], "kwargs": {"name": "queued"}}

    shown = cli("runs", "get", run_id)
    assert shown.returncode == 0, shown.stderr
    assert f"run_id:        {run_id}" in shown.stdout
    assert "status:        pending" in shown.stdout

    cancelled = cli("runs", "cancel", run_id, "--reason", "changed my mind")
    assert (cancelled.returncode, cancelled.stdout) == (0, f"run {run_id} cancelled\n")
    assert cli.json("runs", "get", run_id)["status"] == "cancelled"
    assert cli.json("runs", "list", "--status", "cancelled")[0]["run_id"] == run_id


def test_inspect_shows_the_timeline(cli: Cli) -> None:
    run_id = cli.json("run", "flows.py:hi", "--input", '{"name": "ann"}')["run_id"]
    data = cli.json("inspect", run_id)
    assert (data["run_id"], data["status"], data["output"]) == (run_id, "completed", "hi ann")
    timeline = data["events"]
    assert all(set(e) == EVENT_FIELDS for e in timeline)
    assert [e["slot"] for e in timeline] == list(range(1, len(timeline) + 1))
    assert [e["type"] for e in timeline] == [
        "run_created",
        "run_started",
        "step_started",
        "step_completed",
        "run_completed",
    ]
    started, completed = timeline[2], timeline[3]
    assert (started["step_name"], started["attempt"], started["in_band"]) == ("greet", 1, True)
    assert completed["correlation_id"] == started["correlation_id"] is not None
    assert completed["event"]["result"] == "hi ann"
    assert timeline[0]["created_at"].endswith("Z")

    table = cli("inspect", run_id)
    assert table.returncode == 0
    header, *rows = table.stdout.splitlines()[1:]
    assert " ".join(header.split()) == "SLOT TIME (UTC) TYPE CORRELATION ID STEP ATTEMPT BAND"
    assert rows[2].split()[3:8] == ["step_started", started["correlation_id"], "greet", "1", "in"]


def test_settings_lists_every_setting(cli: Cli) -> None:
    result = cli(
        "settings", "--json", "--world", "local:elsewhere", env={"WORKFLOW_MAX_INLINE_STEPS": "5"}
    )
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert "WORKFLOW_STEP_RETRY_DELAY_SECONDS" in rows
    assert "TREADLE_DEPLOYMENT_ID" in rows
    inline = rows["WORKFLOW_MAX_INLINE_STEPS"]
    assert (inline["default"], inline["value"], inline["from_environment"]) == (3, 5, True)
    assert "inline" in inline["description"]
    assert rows["TREADLE_WORLD"]["value"] == "local:elsewhere"
    assert rows["TREADLE_WORLD"]["default"] == "local:.treadle"
    assert all(
        set(row) == {"name", "default", "value", "from_environment", "description", "allowed"}
        for row in rows.values()
    )


def test_runs_move_moves_a_run_between_compatible_deployments_only(cli: Cli) -> None:
    """Issue 11 item 5: ``treadle runs move RUN --to DEPLOYMENT`` repins a run whose workflow
    declares the same compatible tag in both catalogues (the log shows run_repinned); a
    different tag or a retired target is one error line, exit 2, and nothing moves."""
    import asyncio

    from treadle.worlds.local import LocalWorld

    run_id = cli.json("start", "flows.py:hi", "--input", '{"name": "m"}')["run_id"]
    source = cli.json("runs", "get", run_id)["deployment_id"]

    async def register() -> None:
        world = await LocalWorld(cli.cwd / "w").open()
        try:
            for deployment, tag in ((source, "hi-1"), ("blue", "hi-1"), ("green", "hi-2")):
                entry = {"hi": {"params": [], "compatible": tag}}
                await world.deployments.register(deployment, catalogue=entry)
            await world.deployments.register("gone", catalogue={"hi": {"compatible": "hi-1"}})
            await world.deployments.retire("gone")
        finally:
            await world.close()

    asyncio.run(register())
    refused = cli("runs", "move", run_id, "--to", "green")
    assert refused.returncode == 2
    assert "compatible='hi-1' in deployment" in one_error_line(refused)
    retired = cli("runs", "move", run_id, "--to", "gone")
    assert retired.returncode == 2 and "deployment gone is retired" in one_error_line(retired)
    assert cli.json("runs", "get", run_id)["deployment_id"] == source

    moved = cli.json("runs", "move", run_id, "--to", "blue", "--reason", "hotfix")
    assert moved == {"run_id": run_id, "from": source, "to": "blue", "outcome": "moved"}
    assert cli.json("runs", "get", run_id)["deployment_id"] == "blue"
    last = cli.json("inspect", run_id)["events"][-1]
    assert (last["type"], last["in_band"]) == ("run_repinned", False)
    assert last["event"]["reason"] == "hotfix"
    again = cli("runs", "move", run_id, "--to", "blue")
    assert (again.returncode, again.stdout) == (
        0,
        f"run {run_id} is on blue already; woken there\n",
    )
