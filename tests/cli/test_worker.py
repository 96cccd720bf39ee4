"""``treadle worker`` in the background, with the CLI beside it: hooks resume, wake."""

from __future__ import annotations

import signal
from typing import Any

from tests.cli.conftest import Cli, one_error_line


def _has(kind: str) -> Any:
    return lambda run: any(e["type"] == kind for e in run["events"])


def _ended(run: dict[str, Any]) -> bool:
    return run["status"] in ("completed", "failed", "cancelled")


def test_a_worker_serves_runs_the_cli_resumes_and_wakes(cli: Cli) -> None:
    hook_run = cli("start", "flows.py:approve", "--input", '{"token": "order-9"}').stdout.strip()
    nap_run = cli("start", "flows.py:nap").stdout.strip()
    worker = cli.background("worker", "flows.py", "--concurrency", "4", "--grace", "1")

    cli.wait_for_run(hook_run, _has("hook_created"))
    # One process consumes a local World's queue: a second in-process worker is refused.
    refused = cli("run", "flows.py:hi", "--input", '{"name": "x"}')
    assert refused.returncode == 2
    assert "is being served by another process" in one_error_line(refused)

    resumed = cli("hooks", "resume", "order-9", "--payload", '{"approved": true}')
    assert (resumed.returncode, resumed.stdout) == (0, f"hook 'order-9' resumed run {hook_run}\n")
    done = cli.wait_for_run(hook_run, _ended)
    assert (done["status"], done["output"]) == ("completed", True)
    again = cli("hooks", "resume", "order-9", "--payload", "{}")
    assert "no live hook with token 'order-9'" in one_error_line(again)

    cli.wait_for_run(nap_run, _has("wait_created"))
    assert cli.json("runs", "wake", nap_run) == {"run_id": nap_run, "waits": 1}
    napped = cli.wait_for_run(nap_run, _ended)
    assert (napped["status"], napped["output"]) == ("completed", "rested")

    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=20)
    assert worker.returncode == 0, stderr
    assert "treadle worker: serving approve, fails, hi, nap" in stderr
    assert "Traceback" not in stderr
