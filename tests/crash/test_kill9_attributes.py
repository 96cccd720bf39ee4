"""kill -9 a ``treadle worker`` mid run after its attr_set events; restart it (issue 17
item 2, docs/attributes.md).

The run is started with ``treadle start --attr``; its workflow writes ``stage`` in-band
before a step, the step writes its attempt out of band and hangs on attempt 1, and the
worker is killed there. The restarted worker replays the log (the first ``stage`` is
found, never written again), runs the step's second attempt and finishes. The record
is the fold of the log; ``treadle runs list --attr`` finds the run by its attributes
(ANDed), on both Worlds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .test_kill9 import Cluster, _kill, cluster

__all__ = ["cluster"]

WORKFLOWS = Path(__file__).with_name("attr_workflows.py")


def _worker(c: Cluster) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "treadle.cli", "worker", str(WORKFLOWS)],
        env={**c.env, "WORKFLOW_MAX_INLINE_STEPS": "3"},
    )
    c.workers.append(proc)
    return proc


def test_sigkill_after_attr_sets_finishes_with_every_attribute_once(cluster: Cluster) -> None:
    run_id = cluster.cli(
        "start", f"{WORKFLOWS}:tagged", "--input", json.dumps({"name": "s"}),
        "--attr", "customer=acme", "--attr", "tier=3",
    ).strip()  # fmt: skip
    first = _worker(cluster)
    cluster.wait_for_line("s start 1", first)
    cluster.wait_for_start(run_id, 1)  # the body may start before its start commits
    seen = json.loads(cluster.cli("inspect", run_id, "--json"))["events"]
    assert [e["type"] for e in seen].count("attr_set") == 2, seen  # stage, step_attempt
    _kill(first)
    for _ in range(cluster.size):
        _worker(cluster)
    run = cluster.wait_for_run(run_id)
    assert run["status"] == "completed", run
    assert run["output"] == "s:2"
    assert run["attributes"] == {
        "customer": "acme",
        "tier": 3,
        "stage": "done",
        "result": "s:2",
        "step_attempt": 2,
    }
    log = json.loads(cluster.cli("inspect", run_id, "--json"))["events"]
    sets = [e["event"] for e in log if e["type"] == "attr_set"]
    positions = [s["position"] for s in sets if s.get("position") is not None]
    assert len(positions) == len(set(positions)) == 3, sets  # stage, stage, result: once each
    assert [s["value"] for s in sets if s["key"] == "step_attempt"] == [1, 2]
    found = json.loads(
        cluster.cli("runs", "list", "--attr", "customer=acme", "--attr", "stage=done", "--json")
    )
    assert [r["run_id"] for r in found] == [run_id]
    assert json.loads(cluster.cli("runs", "list", "--attr", 'tier="3"', "--json")) == []
    assert json.loads(cluster.cli("runs", "list", "--attr", "stage=working", "--json")) == []
