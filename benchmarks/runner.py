"""Runs each job of a plan in a fresh child process and pools what the children report."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.child import RESULT_PREFIX
from benchmarks.plan import Job
from benchmarks.processes import ROOT, child_env, python
from benchmarks.servers import Servers


@dataclass
class Outcome:
    """Every repeat of one scenario of one system on one World, pooled."""

    metrics: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    unsupported: str | None = None
    seconds: float = 0.0

    def add(self, result: dict[str, Any], seconds: float) -> None:
        self.seconds += seconds
        if "unsupported" in result:
            self.unsupported = result["unsupported"]
        if "error" in result:
            self.errors.append(result["error"])
        for name, values in result.get("metrics", {}).items():
            self.metrics[name].extend(values)
        for note in result.get("notes", []):
            if note not in self.notes:
                self.notes.append(note)


Results = dict[tuple[str, str, str], Outcome]


def run_job(job: Job, servers: Servers | None, workdir: Path) -> tuple[dict[str, Any], float]:
    """One child process; its result (``metrics`` and ``notes``, ``unsupported`` or ``error``)."""
    jobdir = workdir / job.label.replace("/", "-").replace("#", "-")
    jobdir.mkdir(parents=True)
    params = {**job.params, "workdir": str(jobdir)}
    if servers is not None:
        params |= {"pg_admin_dsn": servers.pg_admin_dsn, "nats_url": servers.nats_url}
    params_path = jobdir / "params.json"
    params_path.write_text(json.dumps(params))
    argv = python("-m", "benchmarks.child", job.system, job.scenario, str(params_path))
    started = time.monotonic()
    with (jobdir / "stderr.log").open("w") as stderr:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=child_env({}), stdout=subprocess.PIPE, stderr=stderr,
            text=True, start_new_session=True,
        )  # fmt: skip
        try:
            stdout, _ = proc.communicate(timeout=job.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return {"error": f"timed out after {job.timeout:g} s"}, time.monotonic() - started
        finally:
            _kill_group(proc)  # worker processes the child started and left behind
    seconds = time.monotonic() - started
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
            if "error" in result:
                result["error"] += f" (log: {jobdir / 'stderr.log'})"
            return result, seconds
    tail = (jobdir / "stderr.log").read_text(errors="replace").strip().splitlines()[-3:]
    return {"error": f"exit code {proc.returncode}: {' | '.join(tail)}"}, seconds


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
