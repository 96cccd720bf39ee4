"""Worker processes a scenario starts, waits for, kills with SIGKILL, and stops.

``Worker.start(argv, env, ready=...)`` starts a process, copies its stderr to
a log file, and returns once a line of it contains ``ready`` (so the process
is serving before the measurement begins).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READY_SECONDS = 60.0


class WorkerDied(RuntimeError):
    """A worker process exited before it was ready; the message holds its last output."""


@dataclass
class Worker:
    proc: asyncio.subprocess.Process
    log: Path
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    _drain: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    async def start(cls, argv: list[str], env: dict[str, str], log: Path, ready: str) -> Worker:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=ROOT,
            env=child_env(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        worker = cls(proc, log)
        worker._drain = asyncio.create_task(worker._copy_stderr(ready))
        waiting = asyncio.create_task(worker.ready.wait())
        done, _ = await asyncio.wait(
            {waiting, worker._drain}, timeout=READY_SECONDS, return_when=asyncio.FIRST_COMPLETED
        )
        if waiting not in done:
            waiting.cancel()
            await worker.kill()
            raise WorkerDied(f"{' '.join(argv)} did not become ready: {_tail(log)}")
        return worker

    async def _copy_stderr(self, ready: str) -> None:
        assert self.proc.stderr is not None
        with self.log.open("ab") as sink:
            async for line in self.proc.stderr:
                sink.write(line)
                sink.flush()
                if ready in line.decode(errors="replace"):
                    self.ready.set()

    async def kill(self) -> int:
        """SIGKILL now; the ``perf_counter_ns`` just before the signal was sent."""
        now = time.perf_counter_ns()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        await self.proc.wait()
        return now

    async def stop(self, timeout: float = 15.0) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                await self.kill()
        if self._drain is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._drain, 5)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-1500:].strip() if log.exists() else ""


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """This environment, the repository on ``PYTHONPATH``, and ``extra``."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def python(*args: str) -> list[str]:
    return [sys.executable, *args]
