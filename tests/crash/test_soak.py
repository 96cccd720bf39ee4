"""200 concurrent fan-out runs across 3 worker processes on Postgres + NATS.

Every run must complete with the sum its steps return, and every log must pass
``treadle.world.logcheck``: dense slots, the fence's arithmetic, per-step order,
one outcome per step.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from treadle import Workflows, settings
from treadle.world import logcheck
from treadle.worlds.production import PostgresNatsWorld

from .test_kill9 import WORKFLOWS

RUNS = 200
WIDTH = 10


async def test_200_concurrent_fan_outs_across_3_workers(
    pg_dsn: str, nats_server: object, tmp_path: Path
) -> None:
    """Soak: every run completes, every log is sound, no step has two outcomes."""
    url: str = nats_server.url  # type: ignore[attr-defined]
    env = {
        **os.environ,
        "TREADLE_WORLD": "postgres",
        "TREADLE_DATABASE_URL": pg_dsn,
        "TREADLE_NATS_URL": url,
        "TREADLE_TEST_EFFECTS": str(tmp_path / "effects.txt"),
        "TREADLE_DEPLOYMENT_ID": "soak",
    }
    workers = [
        subprocess.Popen([sys.executable, "-m", "treadle.cli", "worker", str(WORKFLOWS)], env=env)
        for _ in range(3)
    ]
    world = await PostgresNatsWorld.connect(pg_dsn, url, deployment_id="soak")
    client = Workflows(
        world=world, worker=False, settings_=settings.load({}, TREADLE_DEPLOYMENT_ID="soak")
    )
    try:
        started = time.monotonic()
        data = {"args": [WIDTH], "kwargs": {}}
        runs = await asyncio.gather(*(client.start_encoded("fan", data) for _ in range(RUNS)))
        results = await asyncio.gather(*(run.result(timeout=300) for run in runs))
        elapsed = time.monotonic() - started
        print(f"{RUNS} runs x {WIDTH} steps across 3 workers in {elapsed:.1f} s")
        assert results == [sum(range(WIDTH))] * RUNS
        for run in runs:
            record = await run.get()
            assert logcheck.problems(record, await run.events()) == []
            assert record.status == "completed"
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        for proc in workers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        await world.close()
