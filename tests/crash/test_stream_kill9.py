"""kill -9 a ``treadle worker`` mid-stream (issue 17 item 6, docs/streams.md).

A reader (``treadle runs stream``, its own process) follows the stream while the
worker writes it. The worker is killed after attempt 1 flushed three chunks; the
reader has them and keeps waiting (the stream is open, the run running). A new
worker runs the step again as attempt 2, whose chunks follow attempt 1's (the
retry rule: append-only, marked by attempt) and close the stream: the reader ends,
and the run completes. On both Worlds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .test_kill9 import Cluster, _kill, cluster

__all__ = ["cluster"]

WORKFLOWS = Path(__file__).with_name("stream_workflows.py")


def _start_worker(cluster: Cluster, **extra_env: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "treadle.cli", "worker", str(WORKFLOWS)],
        env={**cluster.env, **extra_env},
    )
    cluster.workers.append(proc)
    return proc


def test_sigkill_mid_stream_the_reader_sees_both_attempts_and_the_run_finishes(
    cluster: Cluster,
) -> None:
    cluster.env["TREADLE_STREAM_POLL_SECONDS"] = "0.2"
    run_id = cluster.cli("start", f"{WORKFLOWS}:chatter", "--input", json.dumps({"n": 3})).strip()
    first = _start_worker(cluster, TREADLE_TEST_HANG_FIRST_ATTEMPT="1")
    cluster.wait_for_line(f"flushed 1 {first.pid}", first)
    cluster.wait_for_start(run_id, 1)
    reader = subprocess.Popen(
        [sys.executable, "-m", "treadle.cli", "runs", "stream", run_id, "tokens", "--json"],
        env=cluster.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout is not None
        before = [json.loads(reader.stdout.readline()) for _ in range(3)]
        assert [c["data"] for c in before] == ["a1-0", "a1-1", "a1-2"]
        assert reader.poll() is None  # the stream is open and the run running: it waits
        _kill(first)
        _start_worker(cluster)
        rest, _ = reader.communicate(timeout=60)
        assert reader.returncode == 0
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    after = [json.loads(line) for line in rest.splitlines()]
    seen = before + after
    assert [c["data"] for c in seen] == ["a1-0", "a1-1", "a1-2", "a2-0", "a2-1", "a2-2"]
    assert [c["index"] for c in seen] == list(range(6))
    assert [(c["attempt"], c["seq"]) for c in seen] == [
        (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)
    ]  # fmt: skip
    run = cluster.wait_for_run(run_id)
    assert run["status"] == "completed", run
    assert run["output"] == 2
    printed = cluster.cli("runs", "stream", run_id, "tokens", "--json")
    assert [json.loads(line) for line in printed.splitlines()] == seen
