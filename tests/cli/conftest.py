"""Fixtures for CLI tests: the ``treadle`` command as a real subprocess, on a World
under ``tmp_path``, and a module of small workflows written there."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from treadle.worlds import open_world

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

# Shorter engine timings, as settings: the CLI reads them from the environment.
FAST = {
    "WORKFLOW_ORCHESTRATOR_LINGER_MS": "300",
    "WORKFLOW_ORCHESTRATOR_POLL_INTERVAL_MS": "200",
    "WORKFLOW_STEP_RETRY_DELAY_SECONDS": "0.05",
}

FLOWS = '''
"""Small workflows the CLI tests run."""

import asyncio

from treadle import FatalError, Hook, Workflows, sleep

app = Workflows()


@app.step
async def greet(name: str) -> str:
    return f"hi {name}"


@app.step
async def boom() -> None:
    raise FatalError("the oven is off")


@app.step
async def echo(value: object) -> object:
    return value


@app.workflow
async def hi(name: str) -> str:
    return await greet(name)


@app.workflow
async def fails() -> None:
    await boom()


@app.workflow
async def uses_executor() -> None:
    await asyncio.get_running_loop().run_in_executor(None, print)


@app.workflow
async def sends_object() -> object:
    return await echo(object())


class Approval(Hook):
    approved: bool


@app.workflow
async def approve(token: str) -> bool:
    got = await Approval.wait(token=token)
    return bool(got and got.approved)


@app.workflow
async def nap() -> str:
    await sleep("1h")
    return "rested"
'''


@dataclass
class Cli:
    """Runs ``python -m treadle.cli`` in ``cwd`` with ``TREADLE_WORLD`` set to ``world``."""

    cwd: Path
    world: str
    env: dict[str, str] = field(default_factory=dict)
    children: list[subprocess.Popen[str]] = field(default_factory=list)

    def environment(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("TREADLE_", "WORKFLOW_")) or k == "TREADLE_DEBUG"
        }
        return {**base, **FAST, "TREADLE_WORLD": self.world, **self.env, **(extra or {})}

    def __call__(
        self, *argv: str, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "treadle.cli", *argv],
            cwd=cwd or self.cwd,
            env=self.environment(env),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def json(self, *argv: str, code: int = 0) -> Any:
        """The one JSON value a ``--json`` command prints (exiting with ``code``)."""
        result = self(*argv, "--json")
        assert result.returncode == code, result.stderr
        return json.loads(result.stdout)

    def background(self, *argv: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "treadle.cli", *argv],
            cwd=self.cwd,
            env=self.environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.children.append(proc)
        return proc

    def wait_for_run(
        self, run_id: str, done: Callable[[dict[str, Any]], bool], timeout: float = 20.0
    ) -> dict[str, Any]:
        """Poll ``inspect --json`` (another process's World: no event to await) until ``done``."""
        deadline = time.monotonic() + timeout
        while True:
            seen: dict[str, Any] = self.json("inspect", run_id)
            if done(seen):
                return seen
            assert time.monotonic() < deadline, f"run never got there: {seen}"
            time.sleep(0.1)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single ``treadle: error: ...`` line a mistake prints (and no traceback)."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("treadle: error: "), lines[0]
    return lines[0]


def make_cli(directory: Path) -> Cli:
    """A ``Cli`` in ``directory``, with ``flows.py`` there and its World created."""
    (directory / "flows.py").write_text(FLOWS)
    runner = Cli(cwd=directory, world=f"local:{directory / 'w'}")
    # Created up front: first opens of a new local World from parallel processes race.
    asyncio.run(_create_world(directory / "w"))
    return runner


async def _create_world(path: Path) -> None:
    world = await open_world(f"local:{path}")
    await world.close()


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    runner = make_cli(tmp_path)
    yield runner
    for proc in runner.children:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
