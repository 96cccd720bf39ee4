"""kill -9 a ``treadle worker`` mid step and between a commit and its send; restart it.

Seed 003 "world-local restart", "Crash between commit and dispatch" and
"Inline maxRetries: 0 step after an orchestrator crash" (EDGE-CASES I1, B1,
E1). Each test asserts the run completes and each step's side effect (a line
its body appends to a file) happened exactly as the model promises: a step
with retries runs again as attempt 2 after the crash; a max_retries=0 step
never runs twice; a step whose message was never sent runs once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import pytest

WORKFLOWS = Path(__file__).with_name("crash_workflows.py")


class Cluster:
    """A World and the treadle worker processes the test runs against it.

    On the local World one worker serves at a time; on Postgres + NATS, ``size``
    workers serve together and the test kills whichever one ran the body.
    """

    #: The module every worker serves; subclasses serve their own.
    workflows = WORKFLOWS
    #: Settings every worker of the cluster gets, beside the World's.
    worker_env: ClassVar[Mapping[str, str]] = {}

    def __init__(self, tmp_path: Path, world_env: dict[str, str], size: int) -> None:
        self.effects = tmp_path / "effects.txt"
        self.size = size
        self.env = {**os.environ, "TREADLE_TEST_EFFECTS": str(self.effects), **world_env}
        self.workers: list[subprocess.Popen[bytes]] = []
        self.tmp_path = tmp_path
        self.logs: dict[int, Path] = {}

    def cli(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "treadle.cli", *args], env=self.env, capture_output=True,
            text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout

    def start_worker(self, **extra_env: str) -> subprocess.Popen[bytes]:
        """A ``treadle worker`` process; its stderr (its log) goes to a file of its own."""
        log = self.tmp_path / f"worker-{len(self.workers)}.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", "treadle.cli", "worker", str(self.workflows)],
                env={**self.env, **self.worker_env, **extra_env},
                stderr=sink,
            )
        self.workers.append(proc)
        self.logs[proc.pid] = log
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return self.logs[proc.pid].read_text(errors="replace")

    def wait_for_log(
        self, texts: tuple[str, ...], proc: subprocess.Popen[bytes], timeout: float = 30
    ) -> None:
        """Until the worker's own log holds one of ``texts``."""
        deadline = time.monotonic() + timeout
        while not any(text in self.log(proc) for text in texts):
            assert time.monotonic() < deadline, f"never logged {texts!r}: {self.log(proc)}"
            assert proc.poll() is None, f"the worker exited: {self.log(proc)}"
            time.sleep(0.02)  # another process's file: nothing to await

    def wait_serving(self, *procs: subprocess.Popen[bytes], timeout: float = 60) -> None:
        """Until each worker says it serves: its subscription to the queue is up."""
        for proc in procs:
            self.wait_for_log(("treadle worker: serving",), proc, timeout)

    def start_workers(self, **extra_env: str) -> list[subprocess.Popen[bytes]]:
        return [self.start_worker(**extra_env) for _ in range(self.size)]

    def worker_that_ran(self, name: str, attempt: int) -> subprocess.Popen[bytes]:
        pids = Path(f"{self.effects}.pids").read_text().splitlines()
        pid = next(int(line.split()[2]) for line in pids if line.startswith(f"{name} {attempt} "))
        return next(p for p in self.workers if p.pid == pid)

    def lines(self) -> list[str]:
        return self.effects.read_text().splitlines() if self.effects.exists() else []

    def wait_for_line(self, line: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while line not in self.lines():
            assert time.monotonic() < deadline, f"never saw {line!r}; saw {self.lines()}"
            assert proc.poll() is None or line in self.lines(), "the worker died early"
            time.sleep(0.02)  # another process's file: nothing to await

    def wait_for_start(self, run_id: str, attempt: int, timeout: float = 30) -> None:
        """Until the run's log holds a step_started of ``attempt``. A body may start before
        its start commits (turbo, run-ahead: docs/turbo.md); a kill "mid step" is one
        after the start is recorded, so the next attempt is the step's second."""
        deadline = time.monotonic() + timeout
        while True:
            seen = json.loads(self.cli("inspect", run_id, "--json"))["events"]
            if any(e["type"] == "step_started" and e["attempt"] == attempt for e in seen):
                return
            assert time.monotonic() < deadline, f"no step_started {attempt}: {seen}"
            time.sleep(0.05)  # another process's progress: nothing to await

    def wait_for_run(self, run_id: str, timeout: float = 30) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while True:
            run = json.loads(self.cli("runs", "get", run_id, "--json"))
            if run["status"] in ("completed", "failed", "cancelled"):
                return run
            assert time.monotonic() < deadline, f"run still {run['status']}"
            time.sleep(0.1)  # another process's progress: nothing to await

    def stop(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.fixture(params=["local", "postgres+nats"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Cluster:
    if request.param == "local":
        c = Cluster(tmp_path, {"TREADLE_WORLD": f"local:{tmp_path / 'world'}"}, size=1)
    else:
        c = Cluster(
            tmp_path,
            {
                "TREADLE_WORLD": "postgres",
                "TREADLE_DATABASE_URL": request.getfixturevalue("pg_dsn"),
                "TREADLE_NATS_URL": request.getfixturevalue("nats_server").url,
                "TREADLE_QUEUE_LEASE_SECONDS": "2",
            },
            size=3,
        )
    yield c  # type: ignore[misc]
    c.stop()


def _start(cluster: Cluster, workflow: str, name: str) -> str:
    return cluster.cli(
        "start", f"{WORKFLOWS}:{workflow}", "--input", json.dumps({"name": name})
    ).strip()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.parametrize("where", ["inline", "background"])
def test_sigkill_mid_step_runs_it_again_as_attempt_two(cluster: Cluster, where: str) -> None:
    """The body was running when the worker died: the restarted worker runs it again."""
    inline = "3" if where == "inline" else "0"
    run_id = _start(cluster, "one_step", "s")
    first = cluster.start_worker(
        TREADLE_TEST_HANG_FIRST_ATTEMPT="1", WORKFLOW_MAX_INLINE_STEPS=inline
    )
    cluster.wait_for_line("s start 1", first)
    cluster.wait_for_start(run_id, 1)
    _kill(first)
    cluster.start_worker(WORKFLOW_MAX_INLINE_STEPS=inline)
    run = cluster.wait_for_run(run_id)
    assert run["status"] == "completed", run
    assert run["output"] == "s:2"
    assert cluster.lines() == ["s start 1", "s start 2", "s done 2"]


@pytest.mark.parametrize("where", ["inline", "background"])
def test_sigkill_mid_max_retries_0_step_never_runs_it_twice(cluster: Cluster, where: str) -> None:
    """max_retries=0 is at most once per live owner: after the crash the step fails unrun."""
    inline = "3" if where == "inline" else "0"
    run_id = _start(cluster, "one_step_at_most_once", "z")
    first = cluster.start_worker(
        TREADLE_TEST_HANG_FIRST_ATTEMPT="1", WORKFLOW_MAX_INLINE_STEPS=inline
    )
    cluster.wait_for_line("z start 1", first)
    _kill(first)
    cluster.start_worker(WORKFLOW_MAX_INLINE_STEPS=inline)
    run = cluster.wait_for_run(run_id)
    assert run["status"] == "completed", run
    assert run["output"] == "failed: StepAttemptsExhausted"
    assert cluster.lines() == ["z start 1"]


def test_sigkill_between_step_created_and_its_send(cluster: Cluster) -> None:
    """B1 across a real crash: the redelivery (counted above 1) re-sends; the step runs once."""
    run_id = _start(cluster, "one_step", "b")
    first = cluster.start_worker(TREADLE_TEST_KILL_BEFORE_SEND="1", WORKFLOW_MAX_INLINE_STEPS="0")
    first.wait(timeout=30)
    assert first.returncode == -signal.SIGKILL
    assert cluster.lines() == ["killed before the step message was sent"]
    cluster.start_workers(WORKFLOW_MAX_INLINE_STEPS="0")
    run = cluster.wait_for_run(run_id)
    assert run["status"] == "completed", run
    assert cluster.lines()[1:] == ["b start 1", "b done 1"]


def test_sigstop_past_the_lease_then_sigcont_is_fenced(
    pg_dsn: str, nats_server: object, tmp_path: Path
) -> None:
    """Lease stall overlap across processes (EDGE-CASES A1): the worker running an inline
    body is stopped past its lease; another worker takes the run over and finishes it; when
    the stopped one resumes, its writes are refused by the fence: nothing is written twice.

    Postgres + NATS only: a local World has one consumer, so no other worker could take over.
    """
    cluster = Cluster(
        tmp_path,
        {
            "TREADLE_WORLD": "postgres",
            "TREADLE_DATABASE_URL": pg_dsn,
            "TREADLE_NATS_URL": nats_server.url,  # type: ignore[attr-defined]
            "TREADLE_QUEUE_LEASE_SECONDS": "2",
        },
        size=3,
    )
    try:
        run_id = _start(cluster, "one_step", "p")
        first_gate = tmp_path / "first-gate"  # attempt 1 ends when the test says, not on a clock
        workers = cluster.start_workers(
            TREADLE_TEST_HANG_FIRST_ATTEMPT="1", TREADLE_TEST_FIRST_GATE=str(first_gate)
        )
        cluster.wait_for_line("p start 1", workers[0])
        cluster.wait_for_start(run_id, 1)
        stalled = cluster.worker_that_ran("p", 1)
        os.kill(stalled.pid, signal.SIGSTOP)
        run = cluster.wait_for_run(run_id, timeout=60)
        assert run["status"] == "completed", run
        assert run["output"] == "p:2"
        first_gate.touch()
        os.kill(stalled.pid, signal.SIGCONT)
        cluster.wait_for_line("p done 1", stalled, timeout=30)
        # The resumed worker finds its delivery's lease lost and writes nothing: once it
        # says so, nothing more of it can land.
        cluster.wait_for_log(("lost its lease",), stalled)
        timeline = json.loads(cluster.cli("inspect", run_id, "--json"))
        types = [event["type"] for event in timeline["events"]]
        assert types.count("step_completed") == 1
        assert types.count("run_completed") == 1
        assert types[-1] == "run_completed"
        assert sorted(cluster.lines()) == sorted(["p start 1", "p start 2", "p done 2", "p done 1"])
    finally:
        cluster.stop()
