"""The scale scenarios (issue 15 item 5; ``benchmarks.scale``) run and report what the
report prints: each scenario of each system in its own child process, as the harness
runs it, at the tiniest sizes, on a real PostgreSQL and nats-server (the harness's own
``benchmarks.servers``). No timing is asserted: goals live in the benchmark's output.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # benchmarks/ is a top-level package of the repository
    sys.path.insert(0, str(ROOT))

from benchmarks.child import RESULT_PREFIX  # noqa: E402
from benchmarks.runner import Outcome  # noqa: E402

from benchmarks import plan, report, servers  # noqa: E402

TINY: dict[str, Any] = {
    "workers": 2,
    "workers_scale": {"counts": [1, 2], "one": 4, "ten": 2, "starters": 2},
    "memory": {"sleeping": 10, "runs": 10, "chunks": 2, "starters": 2},
    "sleepers": {"count": 6, "rate": 20, "delay_seconds": 2.0, "starters": 2},
    "history": {"events": [10, 20], "waits": 1, "settle_seconds": 0.05},
}
EXPECTED = {
    "workers": {
        f"{kind}@{steps}step@{n}w"
        for kind in ("runs_per_s", "steps_per_s", "worker_cpu_ms_per_run",
                     "pg_write_xacts_per_run", "pg_wal_kib_per_run")
        for steps in (1, 10) for n in (1, 2)
    },
    "memory": {
        "worker_rss_mib@idle", "worker_rss_mib@10sleeping",
        "worker_rss_growth_mib_per_1k_sleeping", "orchestrator_rss_mib@10runs",
        "orchestrator_rss_growth_mib_per_1k_runs",
    },
    "sleepers": {
        "wake_late_p50_ms", "wake_late_p99_ms", "wake_late_max_ms", "woke_within_1s_pct",
        "sleeping_at_once",
    },
    "history": {"delivery_ms@10events", "delivery_ms@20events"},
}  # fmt: skip
# Only treadle counts its log's events (DBOS's history is a row per step).
# and the NATS messages a run costs (DBOS has no NATS).
TREADLE_ONLY = {
    "history": {"log_events@10events", "log_events@20events"},
    "workers": {f"nats_msgs_per_run@{steps}step@{n}w" for steps in (1, 10) for n in (1, 2)},
}


@pytest.fixture(scope="module")
def running() -> Iterator[servers.Servers]:
    try:
        with servers.started(durable=False) as up:
            yield up
    except servers.ServersUnavailable as exc:
        pytest.skip(f"PostgreSQL or nats-server cannot start here: {exc}")


def _child(system: str, scenario: str, world: str, up: servers.Servers, tmp: Path) -> Any:
    params = {**TINY, "world": world, "workdir": str(tmp), "pg_admin_dsn": up.pg_admin_dsn,
              "nats_url": up.nats_url}  # fmt: skip
    path = tmp / "params.json"
    path.write_text(json.dumps(params))
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.child", system, scenario, str(path)], cwd=ROOT,
        capture_output=True, text=True, timeout=300, check=False, start_new_session=True,
    )  # fmt: skip
    lines = [x for x in done.stdout.splitlines() if x.startswith(RESULT_PREFIX)]
    assert lines, done.stdout + done.stderr[-3000:]
    return json.loads(lines[-1][len(RESULT_PREFIX) :])


def _check(result: dict[str, Any], expected: set[str]) -> None:
    assert "error" not in result, result
    metrics = result["metrics"]
    assert set(metrics) == expected
    for name, values in metrics.items():
        assert values, name
        assert all(math.isfinite(v) for v in values), (name, values)
    assert result["notes"]


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_treadle_runs_each_scale_scenario_on_postgres(
    scenario: str, running: servers.Servers, tmp_path: Path
) -> None:
    result = _child("treadle", scenario, "postgres", running, tmp_path)
    _check(result, EXPECTED[scenario] | TREADLE_ONLY.get(scenario, set()))
    if scenario == "sleepers":
        metrics = result["metrics"]
        assert metrics["sleeping_at_once"] == [6.0]  # every run slept when the first woke
    if scenario == "history":
        # The log grows with the run: the bigger size holds more events than the smaller.
        events = result["metrics"]
        assert events["log_events@20events"][0] > events["log_events@10events"][0] >= 10


def test_treadle_runs_history_on_the_local_world(running: servers.Servers, tmp_path: Path) -> None:
    result = _child("treadle", "history", "local", running, tmp_path)
    _check(result, EXPECTED["history"] | TREADLE_ONLY["history"])


def test_the_worker_scenarios_need_the_production_world(
    running: servers.Servers, tmp_path: Path
) -> None:
    result = _child("treadle", "memory", "local", running, tmp_path)
    assert "Postgres + NATS" in result["unsupported"]


@pytest.mark.skipif(importlib.util.find_spec("dbos") is None, reason="DBOS (the bench extra) "
                    "is not installed: pip install -e '.[bench]'")  # fmt: skip
@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_dbos_runs_each_scale_scenario(
    scenario: str, running: servers.Servers, tmp_path: Path
) -> None:
    _check(_child("dbos", scenario, "postgres", running, tmp_path), EXPECTED[scenario])


def test_the_plan_runs_scale_scenarios_on_treadle_and_dbos_with_their_caps() -> None:
    full = plan.build(quick=False, systems=plan.SYSTEMS, worlds=("local", "postgres"),
                      scenarios=plan.SCENARIOS, repeats=None)  # fmt: skip
    scale_jobs = {(j.system, j.world, j.scenario) for j in full.jobs
                  if j.scenario in ("workers", "memory", "sleepers", "history")}  # fmt: skip
    assert scale_jobs == {
        *(("treadle", "postgres", s) for s in ("workers", "memory", "sleepers", "history")),
        *(("dbos", "postgres", s) for s in ("workers", "memory", "sleepers", "history")),
        ("treadle", "local", "history"),
    }
    assert any("not 100,000" in cap for cap in full.caps)
    assert any(cap.startswith("Vercel runs no scale scenario") for cap in full.caps)
    widest = plan.build(quick=False, systems=("treadle",), worlds=("postgres",),
                        scenarios=("memory",), repeats=None, scale_full=True)  # fmt: skip
    assert widest.jobs[0].params["memory"]["runs"] == 100_000
    assert not any("not 100,000" in cap for cap in widest.caps)


def test_the_report_compares_and_draws_the_scale_scenarios(tmp_path: Path) -> None:
    def outcome(metrics: dict[str, list[float]]) -> Outcome:
        made = Outcome()
        made.metrics.update(metrics)
        return made

    results = {
        ("treadle", "postgres", "workers"): outcome({"runs_per_s@1step@1w": [100.0],
                                                     "runs_per_s@1step@2w": [180.0]}),
        ("dbos", "postgres", "workers"): outcome({"runs_per_s@1step@1w": [50.0],
                                                  "runs_per_s@1step@2w": [90.0]}),
        ("treadle", "postgres", "sleepers"): outcome({"wake_late_p99_ms": [20.0],
                                                      "sleeping_at_once": [6.0]}),
        ("dbos", "postgres", "sleepers"): outcome({"wake_late_p99_ms": [40.0],
                                                   "sleeping_at_once": [6.0]}),
        ("treadle", "postgres", "memory"): outcome({"worker_rss_mib@10sleeping": [80.0]}),
        ("treadle", "postgres", "history"): outcome({"delivery_ms@100events": [3.0],
                                                     "delivery_ms@1000events": [4.0]}),
    }  # fmt: skip
    table = report.table(results)  # type: ignore[arg-type]
    assert "| runs_per_s@1step@2w | 180 | 90.0 | 2.0x |" in table
    assert "| wake_late_p99_ms | 20.0 | 40.0 | 2.0x |" in table
    assert "| sleeping_at_once | 6.00 | 6.00 | - |" in table  # a setup figure: no ratio
    if importlib.util.find_spec("matplotlib") is None:
        return
    assert report.chart(tmp_path / "chart.png", results) is None  # type: ignore[arg-type]
    assert (tmp_path / "chart.png").stat().st_size > 0
