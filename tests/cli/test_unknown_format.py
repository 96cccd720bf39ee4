"""The CLI's out-of-band writes to a run of a format this release does not know
(seed 003 "The rollback floor"): one error line naming the run and its spec version,
nothing written, while reads of the run still work."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.cli.conftest import Cli, one_error_line

from treadle.worlds import open_world


async def _spec_7_run(path: Path) -> str:
    world = await open_world(f"local:{path}")
    try:
        run = await world.runs.create(
            workflow_name="hi", input={"args": ["x"], "kwargs": {}}, deployment_id="local",
            spec_version=7,
        )  # fmt: skip
        return run.run_id
    finally:
        await world.close()


def test_cancel_and_wake_of_a_run_of_an_unknown_format_are_refused_and_write_nothing(
    cli: Cli,
) -> None:
    run_id = asyncio.run(_spec_7_run(cli.cwd / "w"))
    for argv in (("runs", "cancel", run_id), ("runs", "wake", run_id)):
        result = cli(*argv)
        assert result.returncode == 1, result.stderr
        line = one_error_line(result)
        assert f"RunNotSupported: run {run_id} has spec version 7" in line
        assert "nothing was written" in line
    seen = cli.json("inspect", run_id)
    assert seen["status"] == "pending"
    assert [e["type"] for e in seen["events"]] == ["run_created"]
