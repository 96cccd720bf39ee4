"""examples/streams.py run as a program (issue 17 item 6): it prints the tokens as the
step writes them, the progress chunks and the result; ``treadle runs stream`` prints
the chunks again afterwards from another process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "streams.py"


def test_the_streams_example_prints_the_tokens_progress_and_result(tmp_path: Path) -> None:
    env = {**os.environ, "TREADLE_WORLD": f"local:{tmp_path / 'world'}"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "durable streams survive crashes "
    assert lines[1] == (
        "progress: [{'stage': 'counting', 'done': 0}, {'stage': 'counting', 'done': 1}]"
    )
    assert lines[2] == "result: {'words': 4, 'letters': 28}"
    listed = subprocess.run(
        [sys.executable, "-m", "treadle.cli", "runs", "list", "--json"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    (run,) = json.loads(listed.stdout)
    printed = subprocess.run(
        [sys.executable, "-m", "treadle.cli", "runs", "stream", run["run_id"], "tokens", "--raw"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert printed.stdout == "durable streams survive crashes \n"
