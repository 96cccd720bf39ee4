"""The benchmark harness keeps working: ``python -m benchmarks --quick`` on the local World.

DESIGN.md section 8. The quick mode runs every scenario once at tiny sizes, on
treadle only, each in its own child process, and must print the comparison
table and write its JSON result file and chart. The full suite is not run here.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# On the local World the scale scenarios run history only (the others need worker
# processes on Postgres + NATS: tests/benchmarks/test_bench_scale.py).
SCENARIOS = ("ttfs", "stso", "fanout", "throughput", "recovery", "history")


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=180, check=False,
    )  # fmt: skip


def test_quick_suite_measures_every_scenario_and_writes_results(tmp_path: Path) -> None:
    result = _bench("--quick", "--worlds", "local", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| metric | treadle local |" in result.stdout
    (path,) = tmp_path.glob("*-quick.json")
    document = json.loads(path.read_text())
    summary = document["summary"]["treadle/local"]
    assert set(summary) == set(SCENARIOS)
    for scenario, metrics in summary.items():
        assert metrics, f"{scenario} measured nothing"
        for name, values in metrics.items():
            assert math.isfinite(values["p50"]) and values["p50"] > 0, (scenario, name, values)
    assert summary["stso"]["ms_per_step@40"]["n"] == 1
    assert summary["ttfs"]["ttfs_ms"]["n"] == 3
    if importlib.util.find_spec("matplotlib") is None:  # the bench extra draws the chart
        assert "no chart: matplotlib is not installed" in result.stdout
    else:
        assert path.with_suffix(".png").stat().st_size > 0


def test_an_unknown_system_is_one_error_line() -> None:
    result = _bench("--systems", "temporal")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "argument --systems: takes a comma-separated list of treadle, dbos, vercel" in line
