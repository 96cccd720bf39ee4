"""kill -9 (and SIGSTOP) a ``treadle worker`` in the middle of a step with a timeout
(issue 17 item 5, docs/timeouts.md), on both Worlds.

- A heartbeating background step whose worker is killed: once its beats lapse, a new
  delivery records the attempt as ``step_retrying`` with ``StepTimedOut``, and attempt 2
  runs with the last stored details.
- Postgres + NATS: a worker stopped past its lease in a step with a timeout; the step is
  retried elsewhere, and when the stopped worker resumes, its late outcome is dropped.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import pytest

from .test_kill9 import Cluster, _kill

WORKFLOWS = Path(__file__).with_name("timeout_workflows.py")


class TimeoutCluster(Cluster):
    workflows = WORKFLOWS
    worker_env: ClassVar[Mapping[str, str]] = {"WORKFLOW_MAX_INLINE_STEPS": "0"}

    def events(self, run_id: str) -> list[dict[str, object]]:
        seen: list[dict[str, object]] = json.loads(self.cli("inspect", run_id, "--json"))["events"]
        return seen


def _env(request: pytest.FixtureRequest, where: str, tmp_path: Path) -> dict[str, str]:
    if where == "local":
        return {"TREADLE_WORLD": f"local:{tmp_path / 'world'}", "TREADLE_QUEUE_LEASE_SECONDS": "2"}
    return {
        "TREADLE_WORLD": "postgres",
        "TREADLE_DATABASE_URL": request.getfixturevalue("pg_dsn"),
        "TREADLE_NATS_URL": request.getfixturevalue("nats_server").url,
        "TREADLE_QUEUE_LEASE_SECONDS": "2",
    }


def _start(cluster: Cluster, workflow: str, name: str) -> str:
    return cluster.cli(
        "start", f"{WORKFLOWS}:{workflow}", "--input", json.dumps({"name": name})
    ).strip()


@pytest.mark.parametrize("where", ["local", "postgres+nats"])
def test_sigkill_mid_heartbeating_step_retries_it_after_the_lapse_with_its_details(
    request: pytest.FixtureRequest, tmp_path: Path, where: str
) -> None:
    cluster = TimeoutCluster(tmp_path, _env(request, where, tmp_path), size=1)
    try:
        run_id = _start(cluster, "heartbeating", "h")
        first = cluster.start_worker()
        cluster.wait_for_line("h beat stored", first)
        _kill(first)
        cluster.start_worker()
        run = cluster.wait_for_run(run_id, timeout=60)
        assert run["status"] == "completed", run
        assert run["output"] == {"attempt": 2, "resumed": {"done": 3}}
        seen = cluster.events(run_id)
        retries = [e for e in seen if e["type"] == "step_retrying"]
        errors = [(r["attempt"], r["event"]["error"]) for r in retries]  # type: ignore[index]
        assert [(attempt, error["type"]) for attempt, error in errors] == [(1, "StepTimedOut")]
        assert "heartbeat_timeout of 1.5 s" in errors[0][1]["message"]
        starts = [e["attempt"] for e in seen if e["type"] == "step_started"]
        assert starts == [1, 2]
        assert cluster.lines() == ["h start 1 null", "h beat stored", 'h start 2 {"done": 3}',
                                   "h done 2"]  # fmt: skip
    finally:
        cluster.stop()


def test_sigstop_past_a_step_timeout_then_sigcont_drops_the_late_outcome(
    pg_dsn: str, nats_server: object, tmp_path: Path
) -> None:
    """The stopped worker's attempt 1 loses its lease; another worker's delivery runs
    attempt 2; resumed, attempt 1 returns, and its outcome is dropped before it is
    written (its delivery's lost lease, or ``steptimeouts.still_latest``): the log holds
    attempt 2's result only.
    Postgres + NATS only: a local World has one consumer, so no other could take over."""
    cluster = TimeoutCluster(
        tmp_path,
        {
            "TREADLE_WORLD": "postgres",
            "TREADLE_DATABASE_URL": pg_dsn,
            "TREADLE_NATS_URL": nats_server.url,  # type: ignore[attr-defined]
            "TREADLE_QUEUE_LEASE_SECONDS": "2",
        },
        size=2,
    )
    try:
        run_id = _start(cluster, "timed_step", "t")
        # Attempt 1 sleeps 20 s, inside its 60 s timeout: stopped, it returns after the run
        # completed on the other worker, in time by its own clock and superseded.
        workers = cluster.start_workers(TREADLE_TEST_HANG_SECONDS="20")
        cluster.wait_for_line("t start 1", workers[0])
        cluster.wait_for_start(run_id, 1)
        stalled = cluster.worker_that_ran("t", 1)
        os.kill(stalled.pid, signal.SIGSTOP)
        run = cluster.wait_for_run(run_id, timeout=60)
        assert run["status"] == "completed", run
        assert run["output"] == "t:2", (cluster.lines(), cluster.events(run_id))
        os.kill(stalled.pid, signal.SIGCONT)
        cluster.wait_for_line("t done 1", stalled, timeout=30)
        # The resumed worker drops its late outcome, and says so, before the log is read:
        # its delivery lost its lease, or (lease still held) the step's log moved on.
        dropped = ("stopped without writing", "its outcome is dropped")
        cluster.wait_for_log(dropped, stalled)
        seen = cluster.events(run_id)
        completed = [e["event"]["result"] for e in seen if e["type"] == "step_completed"]  # type: ignore[index]
        assert completed == ["t:2"]
        assert [e["attempt"] for e in seen if e["type"] == "step_started"] == [1, 2]
        assert seen[-1]["type"] == "run_completed"
        assert sorted(cluster.lines()) == ["t done 1", "t done 2", "t start 1", "t start 2"]
    finally:
        cluster.stop()
