"""``treadle inspect`` and ``treadle settings`` for spec 8 (issue 12 item 6).

- ``inspect`` of a spec 8 run shows, for each inline step, its owner message id and
  ownership phase (seed 000 "Latest step_started wins", "step_retrying lapses
  ownership"), and for an owned one when its backstop wake comes due (last start +
  lease) and its epoch key; a spec 9 run prints as before.
- ``settings`` lists WORKFLOW_SPEC_VERSION, WORKFLOW_INLINE_OWNERSHIP and
  WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS with their allowed values and clamps.
"""

from __future__ import annotations

import asyncio
import json
import signal
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from tests.cli.conftest import Cli

from treadle.orchestrator.spec8 import ownership
from treadle.world import events
from treadle.worlds import open_world

OWNER = "msg_01JOWNERAAAAAAAAAAAAAAAAAA"


async def _spec8_run_with_inline_steps(
    path: Path, spec_version: int = 8
) -> tuple[str, dict[str, datetime]]:
    """A run whose log holds three inline steps, as a spec 8 delivery writes them: one
    owned and running, one queue-owned after a retry, one completed."""
    world = await open_world(f"local:{path}")
    try:
        run = await world.runs.create(
            workflow_name="hi", input={"args": ["x"], "kwargs": {}}, deployment_id="local",
            spec_version=spec_version,
        )  # fmt: skip
        writes: list[events.Event] = [
            events.StepStarted(
                correlation_id="step_owned", step_name="greet", attempt=1, inline=True,
                input={"args": ["a"], "kwargs": {}}, owner_message_id=OWNER,
            ),
            events.StepStarted(
                correlation_id="step_retried", step_name="greet", attempt=1, inline=True,
                input={"args": ["b"], "kwargs": {}}, owner_message_id=OWNER,
            ),
            events.StepRetrying(
                correlation_id="step_retried", step_name="greet", attempt=1,
                error=events.ErrorInfo(message="busy"),
            ),
            events.StepStarted(
                correlation_id="step_done", step_name="greet", attempt=1, inline=True,
                input={"args": ["c"], "kwargs": {}}, owner_message_id=OWNER,
            ),
            events.StepCompleted(correlation_id="step_done", step_name="greet", result="hi c"),
        ]  # fmt: skip
        for event in writes:
            await world.events.create(run.run_id, event, in_band=False)
        logged = (await world.events.list(run.run_id)).events
        started = {e.correlation_id or "": e.created_at for e in logged if e.type == "step_started"}
        return run.run_id, started
    finally:
        await world.close()


def test_inspect_shows_each_inline_steps_owner_phase_and_backstop(cli: Cli) -> None:
    run_id, starts = asyncio.run(_spec8_run_with_inline_steps(cli.cwd / "w"))
    env = {"WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS": "120"}
    result = cli("inspect", run_id, "--json", env=env)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    rows = {r["correlation_id"]: r for r in seen["inline_ownership"]}
    assert list(rows) == ["step_owned", "step_retried", "step_done"]

    owned = rows["step_owned"]
    started = starts["step_owned"]
    assert (owned["phase"], owned["owner_message_id"], owned["lapsed"]) == ("owned", OWNER, False)
    due = datetime.fromisoformat(owned["backstop_due_at"].replace("Z", "+00:00"))
    assert abs(due - (started + timedelta(seconds=120))) < timedelta(milliseconds=1)
    assert owned["backstop_key"] == ownership.backstop_key("step_owned", started)
    assert owned["backstop_key"].startswith("step_owned:backstop:")
    assert owned["lease_expired"] is False

    retried = rows["step_retried"]
    assert (retried["phase"], retried["owner_message_id"], retried["lapsed"]) == (
        "unowned",
        None,
        True,
    )
    assert retried["backstop_due_at"] is None and retried["backstop_key"] is None
    done = rows["step_done"]
    assert (done["phase"], done["owner_message_id"]) == ("terminal", None)
    assert done["last_start_owner_message_id"] == OWNER
    assert retried["last_start_owner_message_id"] == OWNER  # stamped, then lapsed by the retry

    table = cli("inspect", run_id, env=env)
    assert table.returncode == 0, table.stderr
    section = table.stdout.split("inline steps (spec 8 ownership, lease 120 s):\n", 1)[1]
    header, *lines = section.splitlines()
    assert header.split()[:3] == ["CORRELATION", "ID", "STEP"]
    first = lines[0].split()
    assert first[:4] == ["step_owned", "greet", "owned", OWNER]
    assert first[-1] == owned["backstop_key"]
    assert lines[1].split()[:4] == ["step_retried", "greet", "unowned", "-"]
    assert lines[2].split()[:6] == ["step_done", "greet", "terminal", OWNER, "(ran", "it)"]


HELD = '''
"""A spec 8 run whose inline step holds until a file appears."""

import asyncio
import os

from treadle import Workflows

app = Workflows()


@app.step
async def hold(path: str) -> str:
    while not os.path.exists(path):
        await asyncio.sleep(0.05)
    return "released"


@app.workflow
async def held(path: str) -> str:
    return await hold(path)
'''


def _owned(seen: dict[str, Any]) -> bool:
    return any(r["phase"] == "owned" for r in seen.get("inline_ownership") or [])


def test_inspect_shows_the_worker_message_that_owns_a_running_inline_step(cli: Cli) -> None:
    """A real spec 8 run in a worker process: while its inline step's body runs, another
    process's inspect names the owning message and the backstop; once it ended, the
    message that ran it."""
    (cli.cwd / "held.py").write_text(HELD)
    cli.env["WORKFLOW_SPEC_VERSION"] = "8"
    release = cli.cwd / "release"
    run_id = cli("start", "held.py:held", "--input", json.dumps({"path": str(release)}))
    run_id_text = run_id.stdout.strip()
    assert run_id.returncode == 0 and run_id_text.startswith("wrun_"), run_id.stderr
    worker = cli.background("worker", "held.py", "--grace", "1")
    seen = cli.wait_for_run(run_id_text, _owned)
    assert seen["spec_version"] == 8
    (row,) = seen["inline_ownership"]
    assert row["step_name"] == "hold" and row["owner_message_id"].startswith("msg_")
    assert row["backstop_key"].startswith(f"{row['correlation_id']}:backstop:")
    release.write_text("go")
    done = cli.wait_for_run(run_id_text, lambda r: r["status"] == "completed")
    (ended,) = done["inline_ownership"]
    assert ended["phase"] == "terminal"
    assert ended["last_start_owner_message_id"] == row["owner_message_id"]
    worker.send_signal(signal.SIGTERM)
    worker.communicate(timeout=20)


def test_inspect_of_a_spec_9_run_is_unchanged(cli: Cli) -> None:
    run_id, _ = asyncio.run(_spec8_run_with_inline_steps(cli.cwd / "w", spec_version=9))
    seen = cli.json("inspect", run_id)
    assert "inline_ownership" not in seen
    table = cli("inspect", run_id)
    assert table.returncode == 0 and "spec 8 ownership" not in table.stdout


def test_settings_lists_the_spec_8_settings_with_their_allowed_values_and_clamps(
    cli: Cli,
) -> None:
    result = cli("settings", "--json", env={"WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS": "5000"})
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    spec = rows["WORKFLOW_SPEC_VERSION"]
    assert (spec["default"], spec["value"]) == (None, None)
    assert spec["allowed"].startswith("8, 9 or unset")
    switch = rows["WORKFLOW_INLINE_OWNERSHIP"]
    assert (switch["default"], switch["value"], switch["allowed"]) == (
        True,
        True,
        "1 or 0 (true or false)",
    )
    lease = rows["WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS"]
    assert (lease["default"], lease["value"], lease["from_environment"]) == (860.0, 900.0, True)
    assert lease["allowed"].startswith("1..900 seconds; outside is clamped")
    assert "WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS=5000 is outside 1..900" in result.stderr

    table = cli("settings", env={"WORKFLOW_SPEC_VERSION": "8"})
    assert table.returncode == 0, table.stderr
    (line,) = [r for r in table.stdout.splitlines() if r.startswith("WORKFLOW_SPEC_VERSION ")]
    assert line.split()[1:3] == ["null", "8"]
    assert "Allowed: 8, 9 or unset" in line
