"""Concurrency limits across worker processes and a kill -9 (issue 17 item 4).

A workflow's slot belongs to its run, not to the worker that runs it: a worker killed
while its run holds the slot leaves the slot held until the run, recovered by another
worker, ends; then the waiter is woken and runs. On Postgres + NATS two worker
processes share one count per key (its row in Postgres), so bodies of one key never
overlap across processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_kill9 import Cluster, _kill

WORKFLOWS = Path(__file__).with_name("limit_workflows.py")


class LimitCluster(Cluster):
    workflows = WORKFLOWS

    def start(self, name: str, key: str) -> str:
        data = json.dumps({"name": name, "key": key})
        return self.cli("start", f"{WORKFLOWS}:guarded", "--input", data).strip()

    def get(self, run_id: str) -> dict[str, object]:
        return json.loads(self.cli("runs", "get", run_id, "--json"))  # type: ignore[no-any-return]


def _cluster(request: pytest.FixtureRequest, tmp_path: Path, where: str) -> LimitCluster:
    if where == "local":
        return LimitCluster(tmp_path, {"TREADLE_WORLD": f"local:{tmp_path / 'world'}"}, size=1)
    return LimitCluster(
        tmp_path,
        {
            "TREADLE_WORLD": "postgres",
            "TREADLE_DATABASE_URL": request.getfixturevalue("pg_dsn"),
            "TREADLE_NATS_URL": request.getfixturevalue("nats_server").url,
            "TREADLE_QUEUE_LEASE_SECONDS": "2",
            "TREADLE_LIMIT_SWEEP_SECONDS": "1",
        },
        size=2,
    )


@pytest.mark.parametrize("where", ["local", "postgres+nats"])
def test_a_worker_killed_while_its_run_holds_the_slot(
    request: pytest.FixtureRequest, tmp_path: Path, where: str
) -> None:
    cluster = _cluster(request, tmp_path, where)
    try:
        holder = cluster.start("holder", "k")
        first = cluster.start_worker(TREADLE_TEST_HANG_FIRST_ATTEMPT="1")
        cluster.wait_for_line(f"holder in 1 {first.pid}", first)
        waiter = cluster.start("waiter", "k")
        shown = cluster.get(waiter)
        assert shown["status"] == "pending", shown
        assert shown["waiting_on_limit"]["key"] == "k", shown  # type: ignore[index]
        cluster.wait_for_start(holder, 1)
        _kill(first)  # mid step, while its run holds k's one slot
        cluster.start_worker()
        assert cluster.wait_for_run(holder, timeout=60)["output"] == "holder:2"
        done = cluster.wait_for_run(waiter, timeout=60)
        assert done["status"] == "completed" and done["output"] == "waiter:1", done
        lines = [" ".join(line.split()[:3]) for line in cluster.lines()]
        assert lines == [
            "holder in 1",
            "holder in 2",
            "holder out 2",
            "waiter in 1",
            "waiter out 1",
        ]
    finally:
        cluster.stop()


def test_two_worker_processes_share_one_count_per_key(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    cluster = _cluster(request, tmp_path, "postgres+nats")
    try:
        # One delivery at a time each: a worker inside a k body cannot take the wake its
        # release sends, so the next k run goes to the other process. Both serve before
        # the first start: a second worker still importing under load would leave every
        # run to the first, and nothing shared to test.
        workers = cluster.start_workers(
            TREADLE_TEST_HOLD_SECONDS="0.2", TREADLE_WORKER_CONCURRENCY="1"
        )
        cluster.wait_serving(*workers)
        runs = [cluster.start(f"k{i}", "k") for i in range(8)]
        runs += [cluster.start(f"other{i}", "other") for i in range(2)]
        for run_id in runs:
            assert cluster.wait_for_run(run_id, timeout=90)["status"] == "completed"
        lines = [line.split() for line in cluster.lines()]
        inside: set[str] = set()
        for line in lines:
            name, what = line[0], line[1]
            if name.startswith("k"):
                if what == "in":
                    assert not inside, f"{name} entered while {inside} held k: {lines}"
                    inside.add(name)
                else:
                    inside.discard(name)
        pids = {int(line[3]) for line in lines if line[1] == "in" and line[0].startswith("k")}
        assert pids <= {w.pid for w in workers}
        assert len(pids) == 2, f"one process ran every k run: {lines}"
        assert sum(1 for line in lines if line[1] == "in") == 10  # each body once
    finally:
        cluster.stop()
