"""kill -9 (or SIGSTOP) a real ``treadle worker`` inside a step: recovery without the lease.

Issue 15 item 3 (``treadle.world.liveness``, ``treadle.worlds.nats.liveness``,
docs/recovery.md). Every test sets the queue lease to 60 s, so a recovery that
waited for it would miss the 30 s bound each wait has:

- restart in place: a worker started with the dead one's ``TREADLE_WORKER_ID``
  releases its deliveries at start (Postgres + NATS: the identity's heartbeat
  entry; the local World: its one consumer releases every lease at open);
- survivor takeover: another worker takes a dead one's deliveries over once its
  heartbeat is older than ``TREADLE_WORKER_LIVENESS_SECONDS``;
- a stalled worker (SIGSTOP past its liveness) finds its deliveries lost when it
  resumes: its inline step's late outcome is not written, the survivor's stands.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from treadle.worlds.nats import names

from .test_kill9 import WORKFLOWS, Cluster

LEASE = "60"
# Each wait is bounded well below the 60 s lease: a recovery by the lease fails it.
BOUND = 30.0
READY = "treadle worker: serving"


class Workers(Cluster):
    """``Cluster`` with named workers whose stderr goes to a file (readiness, warnings)."""

    def __init__(self, tmp_path: Path, world_env: dict[str, str]) -> None:
        super().__init__(tmp_path, world_env, size=1)
        self.tmp = tmp_path
        self.logs: dict[int, Path] = {}

    def start_named(self, worker_id: str | None, **extra: str) -> subprocess.Popen[bytes]:
        env = {**self.env, **extra}
        if worker_id is not None:
            env["TREADLE_WORKER_ID"] = worker_id
        log = self.tmp / f"worker-{worker_id}-{len(self.workers)}.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", "treadle.cli", "worker", str(WORKFLOWS)],
                env=env, stderr=sink,
            )  # fmt: skip
        self.workers.append(proc)
        self.logs[proc.pid] = log
        return proc

    def log_of(self, proc: subprocess.Popen[bytes]) -> str:
        return self.logs[proc.pid].read_text(errors="replace")

    def wait_for_log(self, proc: subprocess.Popen[bytes], text: str) -> None:
        deadline = time.monotonic() + BOUND
        while text not in self.log_of(proc):
            assert time.monotonic() < deadline, f"never logged {text!r}: {self.log_of(proc)}"
            time.sleep(0.02)  # another process's file: nothing to await

    def attempt_pid(self, name: str, attempt: int) -> int:
        pids = Path(f"{self.effects}.pids").read_text().splitlines()
        return next(int(p.split()[2]) for p in pids if p.startswith(f"{name} {attempt} "))

    def stop(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
        super().stop()


def _nats_env(request: pytest.FixtureRequest) -> dict[str, str]:
    return {
        "TREADLE_WORLD": "postgres",
        "TREADLE_DATABASE_URL": request.getfixturevalue("pg_dsn"),
        "TREADLE_NATS_URL": request.getfixturevalue("nats_server").url,
        "TREADLE_QUEUE_LEASE_SECONDS": LEASE,
        # Its own deployment: its own consumers, and survivors of no other test.
        "TREADLE_DEPLOYMENT_ID": f"rec-{uuid.uuid4().hex[:8]}",
        "TREADLE_LOG_FORMAT": "json",
    }


@pytest.fixture
def nats_workers(request: pytest.FixtureRequest, tmp_path: Path) -> Workers:
    w = Workers(tmp_path, _nats_env(request))
    yield w  # type: ignore[misc]
    w.stop()


def _start(workers: Workers, name: str) -> str:
    return workers.cli(
        "start", f"{WORKFLOWS}:one_step", "--input", json.dumps({"name": name})
    ).strip()


def _wait_listed(workers: Workers, worker_id: str) -> None:
    """Until the worker's heartbeat entry lists a delivery it holds."""
    url, deployment = workers.env["TREADLE_NATS_URL"], workers.env["TREADLE_DEPLOYMENT_ID"]
    key = f"{names.token(deployment)}.{names.token(worker_id)}"

    async def poll() -> None:
        import nats

        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value(f"{names.DEFAULT_STREAM}_WORKERS")
            deadline = time.monotonic() + BOUND
            while True:
                try:
                    entry = await kv.get(key)
                    held = json.loads(entry.value or b"{}").get("held")
                    # Listed, and a gated one with its run lease's holder (the lease
                    # is released by it, or by its token once that is listed too).
                    if held and all(lease is None or rest[-1] for _, lease, *rest in held):
                        return
                except Exception:  # not written yet
                    pass
                assert time.monotonic() < deadline, f"worker {worker_id} never listed a delivery"
                await asyncio.sleep(0.02)
        finally:
            await nc.close()

    asyncio.run(poll())


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_worker_restarted_with_its_identity_releases_what_it_held_at_once(
    nats_workers: Workers,
) -> None:
    """kill -9 inside a step, restart with the same TREADLE_WORKER_ID: attempt 2 starts
    at once, not after the 60 s lease (nor a survivor's liveness window: 60 s too)."""
    w = nats_workers
    run_id = _start(w, "r")
    first = w.start_named(
        "pod-a", TREADLE_TEST_HANG_FIRST_ATTEMPT="1", TREADLE_WORKER_LIVENESS_SECONDS="60"
    )
    w.wait_for_line("r start 1", first)
    w.wait_for_start(run_id, 1)  # the kill is after the start is recorded
    _wait_listed(w, "pod-a")
    _kill(first)
    again = w.start_named("pod-a", TREADLE_WORKER_LIVENESS_SECONDS="60")
    w.wait_for_line("r start 2", again, timeout=BOUND)
    run = w.wait_for_run(run_id, timeout=BOUND)
    assert run["status"] == "completed", run
    assert run["output"] == "r:2"
    assert w.attempt_pid("r", 2) == again.pid
    assert "restarted in place; releasing the 1 deliveries" in w.log_of(again)


def test_a_survivor_takes_a_dead_workers_deliveries_after_its_liveness_lapses(
    nats_workers: Workers,
) -> None:
    """kill -9 inside a step with another worker serving: it takes the step over once the
    dead one's heartbeat is 2 s old, long before the 60 s lease."""
    w = nats_workers
    run_id = _start(w, "s")
    doomed = w.start_named(
        "pod-a", TREADLE_TEST_HANG_FIRST_ATTEMPT="1", TREADLE_WORKER_LIVENESS_SECONDS="2"
    )
    w.wait_for_line("s start 1", doomed)
    w.wait_for_start(run_id, 1)
    survivor = w.start_named("pod-b", TREADLE_WORKER_LIVENESS_SECONDS="2")
    w.wait_for_log(survivor, READY)
    _wait_listed(w, "pod-a")
    _kill(doomed)
    w.wait_for_line("s start 2", survivor, timeout=BOUND)
    run = w.wait_for_run(run_id, timeout=BOUND)
    assert run["status"] == "completed", run
    assert run["output"] == "s:2"
    assert w.attempt_pid("s", 2) == survivor.pid
    assert "worker pod-b takes over its 1 deliveries" in w.log_of(survivor)


def test_a_stalled_worker_finds_its_deliveries_lost_and_writes_no_late_outcome(
    nats_workers: Workers,
) -> None:
    """SIGSTOP a worker inside an inline step past its liveness: a survivor runs attempt 2
    (held at a gate); the stalled worker resumes, its body ends, and its outcome is not
    written: the run's output is attempt 2's."""
    w = nats_workers
    gate, first_gate = w.tmp / "gate", w.tmp / "first-gate"
    inline = {"WORKFLOW_MAX_INLINE_STEPS": "3", "TREADLE_WORKER_LIVENESS_SECONDS": "2"}
    run_id = _start(w, "t")
    # Attempt 1 holds until the test opens its gate: a fixed hang (it was 3 s) could end
    # before a loaded machine's checks below saw it listed (CI: "never listed a delivery").
    stalled = w.start_named(
        "pod-a", TREADLE_TEST_HANG_FIRST_ATTEMPT="1", TREADLE_TEST_FIRST_GATE=str(first_gate),
        **inline,
    )  # fmt: skip
    w.wait_for_line("t start 1", stalled)
    w.wait_for_start(run_id, 1)
    _wait_listed(w, "pod-a")
    os.kill(stalled.pid, signal.SIGSTOP)
    survivor = w.start_named("pod-b", TREADLE_TEST_GATE=str(gate), **inline)
    w.wait_for_line("t start 2", survivor, timeout=BOUND)
    first_gate.touch()  # attempt 1's body ends as soon as its worker runs again
    os.kill(stalled.pid, signal.SIGCONT)
    w.wait_for_line("t done 1", stalled, timeout=BOUND)  # its body ran to its end
    w.wait_for_log(stalled, "lost its lease")
    gate.touch()
    run = w.wait_for_run(run_id, timeout=BOUND)
    assert run["status"] == "completed", run
    assert run["output"] == "t:2"
    assert w.attempt_pid("t", 2) == survivor.pid
    assert stalled.poll() is None  # it lives on, serving


def test_the_local_world_releases_a_killed_workers_leases_when_the_next_one_opens(
    tmp_path: Path,
) -> None:
    """One process consumes a local World: the next one to open it releases every lease the
    dead one held, so the step starts again at once (lease 60 s)."""
    w = Workers(
        tmp_path,
        {"TREADLE_WORLD": f"local:{tmp_path / 'world'}", "TREADLE_QUEUE_LEASE_SECONDS": LEASE},
    )
    try:
        run_id = _start(w, "l")
        first = w.start_named("pod-a", TREADLE_TEST_HANG_FIRST_ATTEMPT="1")
        w.wait_for_line("l start 1", first)
        w.wait_for_start(run_id, 1)  # the body may start before its start commits
        _kill(first)
        again = w.start_named("pod-a")
        w.wait_for_line("l start 2", again, timeout=BOUND)
        run = w.wait_for_run(run_id, timeout=BOUND)
        assert run["status"] == "completed", run
        assert run["output"] == "l:2"
    finally:
        w.stop()
