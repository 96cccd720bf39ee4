"""examples/webhook.py runs as documented: ``python examples/webhook.py`` serves,
starts a checkout, plays the provider (a forged call, then a signed one) and prints
the paid run (issue 13 item 1: the docs' example)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


async def test_the_webhook_example_runs_end_to_end(tmp_path: Path) -> None:
    env = {**os.environ, "TREADLE_WORLD": f"local:{tmp_path / 'world'}"}
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
