"""A World shared by ``treadle worker`` subprocesses and the test process (spec 8 crashes).

Seed 000's recovery paths start with an owner that died mid-body: a worker
subprocess runs an inline step of ``spec8_workflows.py`` whose first attempt
hangs, and the test kills it with SIGKILL. The rest of the timeline (the
queue's redelivery, a wake, the backstop) is then served by an app in this
process (``Cluster.app``), on the same World, wrapped in the engine suites'
``FaultyWorld`` so the test can read every delivery's message id and key and
every send, and capture the warn logs.

On the local World one process serves at a time (the subprocess is dead
before the in-process worker starts); on Postgres + NATS the processes share
the database and the deployment's subjects (a deployment id of their own per
test, on the default stream).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from treadle import Workflows, settings
from treadle.world import contract

from ..engine.conftest import FAST
from ..engine.faults import FaultyWorld

WORKFLOWS = Path(__file__).with_name("spec8_workflows.py")
_serial = itertools.count(1)


def tuning(lease_seconds: float) -> contract.QueueTuning:
    return contract.QueueTuning(
        lease_seconds=lease_seconds, backoff_base_seconds=0.05, backoff_max_seconds=0.5
    )


class Cluster:
    """The World's settings for subprocesses and an opener for this process."""

    def __init__(self, tmp_path: Path, world_env: dict[str, str], kind: str) -> None:
        self.kind = kind
        self.deployment_id = f"t8d{os.getpid()}x{next(_serial)}"
        self.effects = tmp_path / "effects.txt"
        self.world_env = world_env
        self.env = {
            **os.environ,
            "TREADLE_TEST_EFFECTS": str(self.effects),
            "TREADLE_DEPLOYMENT_ID": self.deployment_id,
            "WORKFLOW_SPEC_VERSION": "8",
            **{k: str(v) for k, v in FAST.items()},
            **world_env,
        }
        self.workers: list[subprocess.Popen[bytes]] = []
        self.apps: list[Workflows] = []
        self.worlds: list[Any] = []
        self._tmp = tmp_path

    @classmethod
    def local(cls, tmp_path: Path) -> Cluster:
        return cls(tmp_path, {"TREADLE_WORLD": f"local:{tmp_path / 'world'}"}, "local")

    @classmethod
    def production(cls, tmp_path: Path, dsn: str, nats_url: str) -> Cluster:
        env = {
            "TREADLE_WORLD": "postgres",
            "TREADLE_DATABASE_URL": dsn,
            "TREADLE_NATS_URL": nats_url,
        }
        return cls(tmp_path, env, "postgres+nats")

    # -- this process ----------------------------------------------------------------

    async def open_world(self, lease_seconds: float) -> Any:
        """The World, opened here with a queue lease of ``lease_seconds``."""
        if self.kind == "local":
            from treadle.worlds.local import LocalWorld

            world: Any = await LocalWorld(self._tmp / "world", tuning=tuning(lease_seconds)).open()
        else:
            from treadle.worlds.production import PostgresNatsWorld

            world = await PostgresNatsWorld.connect(
                self.world_env["TREADLE_DATABASE_URL"],
                self.world_env["TREADLE_NATS_URL"],
                deployment_id=self.deployment_id,
                tuning=tuning(lease_seconds),
            )
        self.worlds.append(world)
        return world

    def settings(self, **overrides: Any) -> settings.Settings:
        return settings.load(
            {},
            **{
                **FAST,
                "WORKFLOW_SPEC_VERSION": 8,
                "TREADLE_DEPLOYMENT_ID": self.deployment_id,
                **overrides,
            },
        )

    def app(self, world: Any, *, worker: bool, **overrides: Any) -> Workflows:
        """An app of ``spec8_workflows`` on ``world`` (a worker here when ``worker``)."""
        from . import spec8_workflows

        app = Workflows(world=world, settings_=self.settings(**overrides), worker=worker)
        spec8_workflows.register(app)
        self.apps.append(app)
        return app

    async def start(self, workflow: str, name: str, **overrides: Any) -> str:
        """Start a spec 8 run from this process (no worker here), then let go of the World
        so a subprocess can serve it (the local World serves one process at a time)."""
        world = await self.open_world(5.0)
        starter = self.app(FaultyWorld(world), worker=False, **overrides)
        run = await starter.start(workflow, name)
        await starter.close(grace_seconds=1)
        await world.close()
        self.worlds.remove(world)
        self.apps.remove(starter)
        return run.run_id

    async def serve_here(
        self,
        lease_seconds: float,
        *,
        wrap: Callable[[Any], Any] | None = None,
        **overrides: Any,
    ) -> tuple[Workflows, FaultyWorld]:
        """An in-process worker on the World (``wrap``-ped, if given), recorded by a
        ``FaultyWorld``; its queue lease is ``lease_seconds``."""
        world = await self.open_world(lease_seconds)
        faulty = FaultyWorld(wrap(world) if wrap is not None else world)
        app = self.app(faulty, worker=True, **overrides)
        await app.world()
        return app, faulty

    # -- subprocesses -----------------------------------------------------------------

    def start_worker(self, **extra_env: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "treadle.cli", "worker", str(WORKFLOWS)],
            env={**self.env, **extra_env},
        )
        self.workers.append(proc)
        return proc

    def lines(self) -> list[str]:
        return self.effects.read_text().splitlines() if self.effects.exists() else []

    def wait_for_line(self, line: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while line not in self.lines():
            assert time.monotonic() < deadline, f"never saw {line!r}; saw {self.lines()}"
            assert proc.poll() is None, f"the worker died early (rc {proc.returncode})"
            time.sleep(0.02)  # another process's file: nothing to await

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    # -- the end ----------------------------------------------------------------------

    async def aclose(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for app in self.apps:
            await app.close(grace_seconds=2)
        for world in self.worlds:
            await world.close()

    def stop(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
