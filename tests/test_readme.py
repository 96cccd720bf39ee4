"""The README's promises: a two-command quickstart that works, and CI running the same tests."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _quickstart() -> list[str]:
    section = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "the quickstart has a sh block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_quickstart_is_exactly_two_commands() -> None:
    """One installs and runs an example on the local World; one runs the whole suite."""
    first, second = _quickstart()
    assert "pip install -e ." in first and "treadle run examples/hello.py:hello" in first
    assert "pip install -e '.[dev]'" in second and "pytest" in second


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run installs the dev extras and runs pytest, as the README's second command."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install" in ci and ".[dev]" in ci
    assert "python3 -m pytest" in ci


def test_the_quickstart_example_runs(tmp_path: Path) -> None:
    """The first command's run, as a user would type it (treadle is installed by the suite)."""
    first, _ = _quickstart()
    run = shlex.split(first.split("&&", 1)[1])
    assert run[0] == "treadle"
    env = {**os.environ, "TREADLE_WORLD": f"local:{tmp_path / 'world'}"}
    result = subprocess.run(
        [sys.executable, "-m", "treadle.cli", *run[1:]], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '"HELLO, WORLD!"'
    assert "greet" in result.stderr and "shout" in result.stderr
