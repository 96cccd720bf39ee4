"""examples/webhook.py runs as documented: ``python examples/webhook.py`` serves,
starts a checkout, plays the provider (a forged call, then a signed one) and prints
the paid run (issue 13 item 1: the docs' example), as a spec 8 run and as a spec 9 run
(issue 12: both formats run every example)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("spec_version", ["8", "9"])
async def test_the_webhook_example_runs_end_to_end(tmp_path: Path, spec_version: str) -> None:
    env = {
        **os.environ,
        "TREADLE_WORLD": f"local:{tmp_path / 'world'}",
        "WORKFLOW_SPEC_VERSION": spec_version,
    }
    env.pop("TREADLE_PUBLIC_URL", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "examples" / "webhook.py"),
        cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    text = out.decode()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert "a forged call: 401 signature_invalid" in text, text
    assert "the signed call: 200 {'received': True}" in text, text
    assert "'status': 'paid'" in text, text
