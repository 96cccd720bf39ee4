"""Library code uses ``opentelemetry-api`` only (issue 13 item 3): the SDK is imported by
``treadle.telemetry.setup`` alone (and tests), and ``prometheus_client`` by
``treadle.metrics`` alone, both guarded so a base install imports treadle fine."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "runtime" / "treadle"


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_only_setup_imports_the_opentelemetry_sdk() -> None:
    users = {
        str(p.relative_to(RUNTIME))
        for p in RUNTIME.rglob("*.py")
        if any(m.startswith("opentelemetry.sdk") for m in _imports(p))
    }
    assert users == {"telemetry/setup.py"}


def test_only_treadle_metrics_imports_prometheus_client() -> None:
    users = {
        str(p.relative_to(RUNTIME))
        for p in RUNTIME.rglob("*.py")
        if any(m.startswith("prometheus_client") for m in _imports(p))
    }
    assert users == {"metrics/__init__.py"}


def test_treadle_imports_and_runs_without_opentelemetry_or_prometheus(tmp_path: Path) -> None:
    """A base install (neither package importable): treadle imports, the helpers are
    no-ops, and the exposition says what to install."""
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import sys\n"
        "class _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('opentelemetry', 'prometheus_client'):\n"
        "            raise ImportError(f'blocked {name}')\n"
        "        return None\n"
        "sys.meta_path.insert(0, _Block())\n"
    )
    code = (
        "import treadle, treadle.client\n"
        "from treadle import metrics, telemetry\n"
        "from treadle.telemetry import tracing\n"
        "assert not tracing.AVAILABLE and not metrics.AVAILABLE\n"
        "assert telemetry.configure(environ={'OTEL_TRACES_EXPORTER': 'console'}) is False\n"
        "telemetry.add_to_current('x', 1)\n"
        "print(metrics.exposition().decode().strip())\n"
    )
    env_path = f"{tmp_path}:{RUNTIME.parent}"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert "prometheus-client is not installed" in done.stdout
