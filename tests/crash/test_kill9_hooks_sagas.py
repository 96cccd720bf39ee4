"""kill -9 a ``treadle worker`` in the middle of a saga's compensations, and between a
hook force-claim's commit and its victim wake; restart it (issue 17 items 7 and 8).

The compensations are durable steps: the one running when the worker died runs again
(attempt 2) and the rest run once each, in reverse order. The force-claim's victim is
still woken: the next worker replaying the claimer repays the wake (seed 003
"Force-claim"), and the victim's await raises ``HookForceClaimedError``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from .test_kill9 import Cluster, _kill

WORKFLOWS = Path(__file__).with_name("hk_workflows.py")


class HkCluster(Cluster):
    """test_kill9's cluster, its workers serving hk_workflows.py."""

    workflows = WORKFLOWS

    def wait_for_event(self, run_id: str, what: str, timeout: float = 30, **fields: object) -> None:
        """Until the run's log holds an event of type ``what`` with ``fields``."""
        deadline = time.monotonic() + timeout
        while True:
            seen = json.loads(self.cli("inspect", run_id, "--json"))["events"]
            if any(
                e["type"] == what and all(e.get(k) == v for k, v in fields.items()) for e in seen
            ):
                return
            assert time.monotonic() < deadline, f"no {what} {fields}: {seen}"
            time.sleep(0.05)  # another process's progress: nothing to await


@pytest.fixture(params=["local", "postgres+nats"])
def c(request: pytest.FixtureRequest, tmp_path: Path) -> HkCluster:
    if request.param == "local":
        cluster = HkCluster(tmp_path, {"TREADLE_WORLD": f"local:{tmp_path / 'world'}"}, size=1)
    else:
        cluster = HkCluster(
            tmp_path,
            {
                "TREADLE_WORLD": "postgres",
                "TREADLE_DATABASE_URL": request.getfixturevalue("pg_dsn"),
                "TREADLE_NATS_URL": request.getfixturevalue("nats_server").url,
                "TREADLE_QUEUE_LEASE_SECONDS": "2",
            },
            size=3,
        )
    yield cluster  # type: ignore[misc]
    cluster.stop()


def _start(c: Cluster, workflow: str, name: str) -> str:
    return c.cli("start", f"{WORKFLOWS}:{workflow}", "--input", json.dumps({"name": name})).strip()


def test_sigkill_mid_compensation_finishes_every_compensation_once(c: HkCluster) -> None:
    run_id = _start(c, "trip", "t")
    first = c.start_worker(TREADLE_TEST_HANG_FIRST_ATTEMPT="1")
    c.wait_for_line("undo hotel start 1", first)
    c.wait_for_event(run_id, "step_started", step_name="undo", attempt=1)  # the start is recorded
    _kill(first)
    c.start_workers()
    run = c.wait_for_run(run_id)
    assert run["status"] == "completed", run
    output = run["output"]
    assert isinstance(output, dict) and output["compensated"] is True
    assert "no car" in output["error"]
    assert c.lines() == [
        "book flight",
        "book hotel",
        "undo hotel start 1",
        "undo hotel start 2",
        "undo hotel done 2",
        "undo flight start 1",
        "undo flight done 1",
    ]


def test_sigkill_between_force_claim_and_victim_wake_still_wakes_the_victim(
    c: HkCluster,
) -> None:
    victim = _start(c, "holder", "tok-crash")
    first = c.start_worker(TREADLE_TEST_KILL_BEFORE_VICTIM_WAKE="1")
    c.wait_for_event(victim, "hook_created")
    claimer = _start(c, "taker", "tok-crash")
    first.wait(timeout=60)
    assert c.lines() == ["killed before the victim wake"]
    c.start_workers()
    assert c.wait_for_run(claimer)["output"] == "took"
    run = c.wait_for_run(victim)
    assert run["status"] == "completed", run
    assert run["output"] == f"claimed by {claimer}"
