"""The Argo CD health checks the chart README ships (issue 11 item 1), run as Lua 5.1.

Argo CD runs ``resource.customizations.health.<group>_<kind>`` scripts in
gopher-lua (Lua 5.1) with the object as ``obj``; ``lupa.lua51`` is the same
language. Each snippet is read from ``charts/treadle/README.md`` (the block after
its ``argocd-health`` marker) and evaluated on WorkflowDeployment and WorkflowRun
objects as the operator writes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

README = Path(__file__).resolve().parents[2] / "charts" / "treadle" / "README.md"

try:
    from lupa import lua51
except ImportError:  # pragma: no cover - lupa is a dev dependency
    lua51 = None


def _script(kind: str) -> str:
    text = README.read_text()
    marker = f"<!-- argocd-health: treadle.dev_{kind} -->\n```yaml\n"
    start = text.index(marker) + len(marker)
    block = yaml.safe_load(text[start : text.index("```", start)])
    script: str = block["data"][f"resource.customizations.health.treadle.dev_{kind}"]
    return script


def _health(kind: str, obj: dict[str, Any]) -> tuple[str, str]:
    if lua51 is None:
        pytest.fail("lupa is not installed (pip install -e '.[dev]'): cannot run the Lua")
    lua = lua51.LuaRuntime()
    check = lua.eval(f"function(obj)\n{_script(kind)}\nend")
    result = check(lua.table_from(obj, recursive=True))
    return str(result["status"]), str(result["message"])


def _wfd(generation: int, observed: int | None, **conditions: tuple[str, str]) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [
        {"type": t, "status": s, "reason": r, "message": f"{t} says {r}",
         "observedGeneration": observed}
        for t, (s, r) in conditions.items()
    ]}  # fmt: skip
    if observed is not None:
        status["observedGeneration"] = observed
    return {"metadata": {"generation": generation}, "status": status}


def test_a_rolled_out_deployment_is_healthy_a_stalled_one_degraded_else_progressing() -> None:
    done = _wfd(2, 2, Ready=("True", "RevisionReady"), Stalled=("False", "NotStalled"))
    assert _health("WorkflowDeployment", done)[0] == "Healthy"
    stalled = _wfd(3, 3, Ready=("False", "ImagePull"), Stalled=("True", "ImagePull"))
    assert _health("WorkflowDeployment", stalled) == (
        "Degraded",
        "ImagePull: Stalled says ImagePull",
    )
    coming = _wfd(3, 3, Ready=("False", "RevisionNotReady"), Reconciling=("True", "X"))
    assert _health("WorkflowDeployment", coming)[0] == "Progressing"
    stale = _wfd(4, 3, Ready=("True", "RevisionReady"))
    assert _health("WorkflowDeployment", stale)[0] == "Progressing", "an older generation's Ready"
    assert _health("WorkflowDeployment", {"metadata": {"generation": 1}})[0] == "Progressing"


def _wfr(succeeded: str, failed: str, waiting: int = 0) -> dict[str, Any]:
    return {"metadata": {"generation": 1}, "status": {
        "message": "m", "waitingOnCount": waiting,
        "conditions": [{"type": "Succeeded", "status": succeeded},
                       {"type": "Failed", "status": failed}],
    }}  # fmt: skip


def test_a_run_is_healthy_once_succeeded_degraded_once_failed_suspended_while_waiting() -> None:
    assert _health("WorkflowRun", _wfr("True", "False")) == ("Healthy", "m")
    assert _health("WorkflowRun", _wfr("False", "True"))[0] == "Degraded"
    assert _health("WorkflowRun", _wfr("Unknown", "Unknown"))[0] == "Progressing"
    assert _health("WorkflowRun", _wfr("Unknown", "Unknown", waiting=3))[0] == "Suspended"
    assert _health("WorkflowRun", {"metadata": {}})[0] == "Progressing"
