"""The scenarios, written once for every system: each system hands in a ``Driver``.

A driver starts a named benchmark workflow (``chain``, ``fanout``,
``crash_chain``; the same shapes in every system's app module) and waits for
it; the step bodies' marks (``probe``) carry the times. ``start`` must return
when the system's own start call returns: TTFS counts from there.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from benchmarks import measure, probe
from benchmarks.processes import Worker

RESULT_TIMEOUT = 600.0
Metrics = dict[str, list[float]]
Marks = dict[str, list[tuple[str, int]]]
# Recovery: the crash_chain workflow hangs in this step of this many.
CRASH_STEPS, HANG_AT = 4, 2


class Driver(Protocol):
    async def start(self, workflow: str, *args: Any) -> Any:
        """Start a run of ``workflow(*args)``; a handle for ``wait``."""

    async def wait(self, handle: Any) -> None:
        """Until the run has ended."""


async def wait_marked(key: str) -> None:
    """Until the run ``key`` marked its end (or its join) in this process.

    For systems whose result call polls slowly (once a second or so): what is
    measured comes from the marks either way, this only decides when to go on.
    """

    def ended() -> bool:
        labels = {label for label, _ in probe.MARKS.get(key, [])}
        return probe.END in labels or probe.JOIN in labels

    await measure.until(ended, RESULT_TIMEOUT, f"run {key}")


async def ttfs(driver: Driver, params: dict[str, Any], name: str = "ttfs_ms") -> Metrics:
    samples: list[float] = []
    for i in range(params["warmup"] + params["samples"]):
        key = f"{name}{i}"
        handle = await driver.start("chain", key, 1)
        started = time.perf_counter_ns()
        await driver.wait(handle)
        if i >= params["warmup"]:
            samples.append(measure.first_start_ms(probe.MARKS[key], started))
    return {name: samples}


async def stso(driver: Driver, params: dict[str, Any]) -> Metrics:
    await driver.wait(await driver.start("chain", "warm", 5))
    out: Metrics = {}
    for n in params["sizes"]:
        key = f"stso{n}"
        await driver.wait(await driver.start("chain", key, n))
        out[f"ms_per_step@{n}"] = [measure.ms_per_step(probe.MARKS[key])]
        if n == params["gap_size"]:
            out["stso_gap_ms"] = measure.step_gaps_ms(probe.MARKS[key])
    return out


async def fanout(driver: Driver, params: dict[str, Any]) -> Metrics:
    await driver.wait(await driver.start("fanout", "warm", 5))
    out: Metrics = {}
    for n in params["widths"]:
        key = f"fan{n}"
        handle = await driver.start("fanout", key, n)
        started = time.perf_counter_ns()
        await driver.wait(handle)
        for part, value in measure.fanout_ms(probe.MARKS[key], started).items():
            out[f"fanout{n}_{part}_ms"] = [value]
    return out


async def throughput(
    start: Callable[[str, int], Awaitable[Any]],
    read: Callable[[], Marks],
    spec: dict[str, Any],
) -> Metrics:
    """Bursts of one-step and ten-step ``chain`` runs: runs/s and steps/s to the last end."""
    out: Metrics = {}
    for steps, count in ((1, spec["one"]), (10, spec["ten"])):
        runs = await _burst(start, read, steps, count, spec["starters"])
        out[f"runs_per_s@{steps}step"] = [runs]
        out[f"steps_per_s@{steps}step"] = [runs * steps]
    return out


async def _burst(
    start: Callable[[str, int], Awaitable[Any]],
    read: Callable[[], Marks],
    steps: int,
    count: int,
    concurrency: int,
) -> float:
    keys = [f"tp{steps}-{i}-{uuid.uuid4().hex[:6]}" for i in range(count)]
    queue = list(keys)
    first = time.perf_counter_ns()

    async def starter() -> None:
        while queue:
            await start(queue.pop(), steps)

    await asyncio.gather(*(starter() for _ in range(concurrency)))
    marks: Marks = {}

    def all_ended() -> bool:
        marks.update(read())
        return all(probe.time_of(marks.get(k, []), probe.END) is not None for k in keys)

    await measure.until(all_ended, RESULT_TIMEOUT, f"{count} runs of {steps} steps")
    last = max(probe.time_of(marks[k], probe.END) or 0 for k in keys)
    return measure.per_second(count, first, last)


async def recovery(
    *,
    kills: int,
    probe_file: Path,
    start_workers: Callable[[], Awaitable[list[Worker]]],
    replace: Callable[[], Awaitable[Worker]] | None,
    start_run: Callable[[str], Awaitable[Any]],
    timeout: float,
    replace_victim: Callable[[Worker], Awaitable[Worker]] | None = None,
    metric: str = "recovery_ms",
) -> Metrics:
    """kill -9 the worker inside ``crash_chain``'s hanging step, to that step starting again.

    The hanging step marks ``<HANG_AT>.<pid>``; the kill goes to that pid's worker.
    ``replace`` (when the system needs a new process to recover) is started right
    after the kill, so its start-up counts; ``replace_victim`` likewise, told which
    worker died (a restart in place, under the dead worker's identity). Without
    either, a surviving worker must take the step over.
    """
    samples: list[float] = []
    if replace_victim is None and replace is not None:
        again = replace

        async def replace_victim(_victim: Worker) -> Worker:
            return await again()

    startups: list[float] = []
    for _ in range(kills):
        workers = await start_workers()
        try:
            sample, startup = await _one_kill(
                probe_file, workers, replace_victim, start_run, timeout
            )
            samples.append(sample)
            if startup is not None:
                startups.append(startup)
        finally:
            for worker in workers:
                await worker.stop()
    out = {metric: samples}
    if startups:
        # The replacement's own start-up (spawn to serving), part of ``metric``.
        out[metric.removesuffix("_ms") + "_startup_ms"] = startups
    return out


async def _one_kill(
    probe_file: Path,
    workers: list[Worker],
    replace: Callable[[Worker], Awaitable[Worker]] | None,
    start_run: Callable[[str], Awaitable[Any]],
    timeout: float,
) -> tuple[float, float | None]:
    key = f"rec-{uuid.uuid4().hex[:8]}"

    def hang_marks() -> list[tuple[int, int]]:
        marks = probe.read_file(probe_file).get(key, [])
        prefix = f"{HANG_AT}."
        return [(int(label.split(".")[1]), ns) for label, ns in marks if label.startswith(prefix)]

    await start_run(key)
    await measure.until(lambda: bool(hang_marks()), 120, "the hanging step")
    pid = hang_marks()[0][0]
    victim = next(w for w in workers if w.pid == pid)
    killed = await victim.kill()
    workers.remove(victim)
    startup = None
    if replace is not None:
        spawned = time.perf_counter_ns()
        workers.append(await replace(victim))
        startup = measure.ms(time.perf_counter_ns() - spawned)
    await measure.until(
        lambda: any(p != pid for p, _ in hang_marks()), timeout, "the step after the kill"
    )
    restarted = min(ns for p, ns in hang_marks() if p != pid)

    def ended() -> bool:
        return probe.END in {label for label, _ in probe.read_file(probe_file).get(key, [])}

    await measure.until(ended, 120, "the recovered run's end")
    return measure.ms(restarted - killed), startup
