"""`treadle crds` and `treadle operator` as a user runs them: one line per mistake, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _treadle(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "treadle.cli", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_crds_writes_then_checks_fresh(tmp_path: Path) -> None:
    stale = _treadle("crds", "--check", "--root", str(tmp_path))
    assert stale.returncode == 1
    assert "stale: crds/workflowruns.yaml (run `treadle crds`" in stale.stderr
    wrote = _treadle("crds", "--root", str(tmp_path))
    assert wrote.returncode == 0, wrote.stderr
    assert "wrote crds/workflowdeployments.yaml" in wrote.stdout
    for path in ("crds/workflowruns.yaml", "charts/treadle/templates/crds/workflowruns.yaml"):
        assert (tmp_path / path).read_text() == (ROOT / path).read_text()
    fresh = _treadle("crds", "--check", "--root", str(tmp_path))
    assert (fresh.returncode, fresh.stderr) == (0, "")


def test_operator_without_a_cluster_says_so(tmp_path: Path) -> None:
    done = _treadle("operator", env={"KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path)})
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("treadle: error: no Kubernetes cluster to talk to: not in a Pod")
    assert "Traceback" not in done.stderr
