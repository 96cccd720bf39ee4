"""kill -9 a ``treadle worker`` in the middle of a child workflow; restart it; both runs
finish correctly (issue 17 item 1, docs/children.md).

Three points: while the child's step runs (the child created, the parent waiting on
it); between the parent's ``child_created`` commit and the child run's creation; and
between the child's terminal commit and its outcome's write into the parent's log.
Each run ends completed with the right output, the parent's log holds the child's
outcome exactly once, and ``treadle runs get`` shows the tree (parent link, children).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from .test_kill9 import Cluster, _kill

WORKFLOWS = Path(__file__).with_name("child_workflows.py")


class ChildCluster(Cluster):
    workflows = WORKFLOWS

    def start(self, name: str) -> str:
        return self.cli(
            "start", f"{WORKFLOWS}:parent", "--input", json.dumps({"name": name})
        ).strip()

    def events(self, run_id: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = json.loads(self.cli("inspect", run_id, "--json"))["events"]
        return found


@pytest.fixture(params=["local", "postgres+nats"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "local":
        env = {"TREADLE_WORLD": f"local:{tmp_path / 'world'}"}
    else:
        env = {
            "TREADLE_WORLD": "postgres",
            "TREADLE_DATABASE_URL": request.getfixturevalue("pg_dsn"),
            "TREADLE_NATS_URL": request.getfixturevalue("nats_server").url,
            "TREADLE_QUEUE_LEASE_SECONDS": "2",
        }
    c = ChildCluster(tmp_path, env, size=1)
    yield c
    c.stop()


def _assert_tree_and_one_outcome(cluster: ChildCluster, parent_id: str, output: str) -> None:
    parent = cluster.wait_for_run(parent_id, timeout=60)
    assert parent["status"] == "completed", parent
    assert parent["output"] == output
    (child,) = parent["children"]
    assert child["workflow"] == "child"
    kid = cluster.wait_for_run(child["run_id"], timeout=30)
    assert kid["status"] == "completed"
    assert kid["parent_run_id"] == parent_id
    assert kid["parent_correlation_id"] == child["correlation_id"]
    types = [e["type"] for e in cluster.events(parent_id)]
    assert types.count("child_created") == 1
    assert types.count("child_completed") == 1
    assert types.count("child_failed") == 0
    text = cluster.cli("runs", "get", parent_id)
    assert "children:" in text and child["run_id"] in text
    assert parent_id in cluster.cli("runs", "get", child["run_id"])


def test_sigkill_while_the_child_runs(cluster: ChildCluster) -> None:
    """The child was created and its step was running when the worker died: after the
    restart the step runs again, the child completes, and the parent hears it once."""
    parent_id = cluster.start("c")
    first = cluster.start_worker(TREADLE_TEST_HANG_FIRST_ATTEMPT="1")
    cluster.wait_for_line("c start 1", first)
    (created,) = [e for e in cluster.events(parent_id) if e["type"] == "child_created"]
    cluster.wait_for_start(created["event"]["child_run_id"], 1)  # its body may start before that
    _kill(first)
    cluster.start_worker()
    _assert_tree_and_one_outcome(cluster, parent_id, "parent got c:2")
    assert cluster.lines() == ["c start 1", "c start 2", "c done 2"]


def test_sigkill_between_child_created_and_the_child_run(cluster: ChildCluster) -> None:
    """The parent's decision committed, the child run not created: the redelivery
    creates it (the same derived run id) and both runs finish."""
    parent_id = cluster.start("b")
    first = cluster.start_worker(TREADLE_TEST_CHILD_KILL="before_create")
    first.wait(timeout=30)
    assert first.returncode == -signal.SIGKILL
    assert cluster.lines() == ["killed before_create"]
    created = [e for e in cluster.events(parent_id) if e["type"] == "child_created"]
    assert len(created) == 1
    cluster.start_worker(TREADLE_TEST_CHILD_KILL="before_create")  # killed once already
    _assert_tree_and_one_outcome(cluster, parent_id, "parent got b:1")
    assert cluster.lines() == ["killed before_create", "b start 1", "b done 1"]


def test_sigkill_between_the_childs_end_and_its_report(cluster: ChildCluster) -> None:
    """The child's run_completed committed, its outcome not yet in the parent's log: the
    child's redelivery finds it ended and reports it; the parent completes, once."""
    parent_id = cluster.start("r")
    first = cluster.start_worker(TREADLE_TEST_CHILD_KILL="before_report")
    first.wait(timeout=30)
    assert first.returncode == -signal.SIGKILL
    assert cluster.lines() == ["r start 1", "r done 1", "killed before_report"]
    types = [e["type"] for e in cluster.events(parent_id)]
    assert "child_completed" not in types
    cluster.start_worker(TREADLE_TEST_CHILD_KILL="before_report")
    _assert_tree_and_one_outcome(cluster, parent_id, "parent got r:1")
