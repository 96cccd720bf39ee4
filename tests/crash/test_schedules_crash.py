"""Schedules across real worker processes (issue 17 item 3; docs/schedules.md).

- kill -9 a ``treadle worker`` right after it won a firing's claim, before it started the
  run: the next worker that reads the schedule starts that run, and the firing happens
  exactly once (one run, its step's side effect once), on both Worlds;
- two worker processes on Postgres + NATS, both running the firing loop on one schedule
  that fires every second: one run per firing time, none lost, none twice.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from treadle import Workflows, errors, settings
from treadle.schedules import firing

WORKFLOWS = Path(__file__).with_name("schedule_workflows.py")


class Workers:
    def __init__(self, tmp_path: Path, world_env: dict[str, str]) -> None:
        self.effects = tmp_path / "effects.txt"
        self.env = {**os.environ, "TREADLE_TEST_EFFECTS": str(self.effects),
                    "TREADLE_SCHEDULES_RESCAN_SECONDS": "0.5", **world_env}  # fmt: skip
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, **extra: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "treadle.cli", "worker", str(WORKFLOWS)],
            env={**self.env, **extra},
        )
        self.procs.append(proc)
        return proc

    def client(self) -> Workflows:
        return Workflows(worker=False, settings_=settings.load(self.env))

    def lines(self) -> list[str]:
        return self.effects.read_text().splitlines() if self.effects.exists() else []

    async def wait_for(self, predicate: Any, what: str, timeout: float = 60) -> list[str]:
        deadline = time.monotonic() + timeout
        while not predicate(self.lines()):
            assert time.monotonic() < deadline, f"never saw {what}; saw {self.lines()}"
            await asyncio.sleep(0.05)  # other processes' file: nothing to await
        return self.lines()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


async def _exists(world: Any, run_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            await world.runs.get(run_id)
            return
        except errors.RunNotFound:
            assert time.monotonic() < deadline, f"run {run_id} was never started"
            await asyncio.sleep(0.05)  # another process's progress: nothing to await


@pytest.fixture(params=["local", "postgres+nats"])
def workers(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "local":
        env = {"TREADLE_WORLD": f"local:{tmp_path / 'world'}"}
    else:
        env = {
            "TREADLE_WORLD": "postgres",
            "TREADLE_DATABASE_URL": request.getfixturevalue("pg_dsn"),
            "TREADLE_NATS_URL": request.getfixturevalue("nats_server").url,
            "TREADLE_QUEUE_LEASE_SECONDS": "2",
        }
    w = Workers(tmp_path, env)
    yield w
    w.stop()


async def test_a_worker_killed_right_after_a_claim_fires_it_exactly_once(
    workers: Workers,
) -> None:
    dying = workers.start(TREADLE_TEST_KILL_AFTER_CLAIM="1")
    app = workers.client()
    try:
        schedule = await app.schedule("crashy", "scheduled", cron="* * * * * *", overlap="allow")
        lines = await workers.wait_for(
            lambda seen: any(s.startswith("killed after claiming") for s in seen), "the kill"
        )
        assert dying.wait(timeout=30) == -signal.SIGKILL
        claimed = lines[-1].split()[-1]
        await schedule.pause()  # no more firings: only the claimed one is owed
        world = await app.world()
        with pytest.raises(errors.RunNotFound):
            await world.runs.get(claimed)  # killed between the claim and the start
        record = await schedule.get()
        assert record.state.last_run_id == claimed
        assert record.state.last_fired_at is not None
        assert claimed == firing.run_id_for("crashy", record.state.last_fired_at)

        workers.start()  # its loop reads the schedule: the claimed run names no run yet
        await _exists(world, claimed)
        assert await app.get_run(claimed).result(timeout=60) == claimed
        fired = [s for s in workers.lines() if s.startswith("fired ")]
        assert [s.split()[1] for s in fired] == [claimed], "the firing happened exactly once"
        page = await world.runs.list(workflow_name="scheduled")
        assert [r.run_id for r in page.runs] == [claimed]
    finally:
        await app.close()


# One process at a time consumes a local World: two worker processes need Postgres + NATS.
@pytest.mark.parametrize("workers", ["postgres+nats"], indirect=True)
async def test_two_worker_processes_never_fire_a_time_twice(workers: Workers) -> None:
    first, second = workers.start(), workers.start()
    app = workers.client()
    try:
        schedule = await app.schedule("shared", "scheduled", cron="* * * * * *", overlap="allow")
        await workers.wait_for(
            lambda seen: len([s for s in seen if s.startswith("fired ")]) >= 6, "six firings"
        )
        await schedule.pause()
        assert first.poll() is None and second.poll() is None
        world = await app.world()
        page = await world.runs.list(workflow_name="scheduled", limit=1000)
        for run in page.runs:
            await app.get_run(run.run_id).result(timeout=60)
        times = sorted(
            datetime.fromisoformat(str(r.attributes["treadle.scheduled_at"])) for r in page.runs
        )
        assert len(times) == len(set(times)) >= 6, "one run per firing time"
        gaps = {b - a for a, b in itertools.pairwise(times)}
        assert gaps == {timedelta(seconds=1)}, f"a firing time was lost: {times}"
        for run in page.runs:
            at = datetime.fromisoformat(str(run.attributes["treadle.scheduled_at"]))
            assert run.run_id == firing.run_id_for("shared", at)
        ran = Counter(s.split()[1] for s in workers.lines() if s.startswith("fired "))
        assert set(ran) == {r.run_id for r in page.runs}
        assert set(ran.values()) == {1}, "each firing's step ran once"
    finally:
        await app.close()
