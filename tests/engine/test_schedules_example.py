"""examples/schedules.py runs as a program does (its ``main``), on a local World: the
schedule is recorded, a trigger and a two-morning backfill fire, each run completes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "schedules.py"


async def test_the_schedules_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TREADLE_WORLD", f"local:{tmp_path / 'world'}")
    monkeypatch.setenv("WORKFLOW_ORCHESTRATOR_LINGER_MS", "300")
    spec = importlib.util.spec_from_file_location("example_schedules_main", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    outputs = await module.main()
    assert outputs == ["report for ops: 3 items"] * 3
    async with module.Workflows(world=f"local:{tmp_path / 'world'}", worker=False) as app:
        (schedule,) = await app.list_schedules()
        assert schedule.name == "ops-morning-report"
        assert schedule.state.last_run_id is not None
