"""What every system's scenario computes from its marks, so the numbers mean the same for all.

Times are ``perf_counter_ns`` values (see ``probe``); results are milliseconds.
A scenario's metrics are lists of samples; the parent pools them across
repeats for p50 and p90 (``stats``).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

from benchmarks import probe

NS_PER_MS = 1e6
POLL_SECONDS = 0.005


def ms(ns: float) -> float:
    return ns / NS_PER_MS


def first_start_ms(marks: list[tuple[str, int]], started_ns: int) -> float:
    """TTFS: from ``start()`` returning to the first step body starting."""
    return ms(probe.starts(marks)[0] - started_ns)


def step_gaps_ms(marks: list[tuple[str, int]]) -> list[float]:
    """STSO: the time between one sequential step's start and the next's."""
    starts = probe.starts(marks)
    return [ms(b - a) for a, b in itertools.pairwise(starts)]


def ms_per_step(marks: list[tuple[str, int]]) -> float:
    """The mean step-to-step time of a sequential run (first start to last start)."""
    starts = probe.starts(marks)
    return ms(starts[-1] - starts[0]) / (len(starts) - 1)


def fanout_ms(marks: list[tuple[str, int]], started_ns: int) -> dict[str, float]:
    """Fan-out: to the first and the last branch's start (TTFS, TTLS) and to the join."""
    starts = probe.starts(marks)
    joined = probe.join_time(marks)
    out = {"first": ms(starts[0] - started_ns), "last": ms(starts[-1] - started_ns)}
    if joined is not None:
        out["join"] = ms(joined - started_ns)
    return out


def per_second(count: int, first_ns: int, last_ns: int) -> float:
    return count / ((last_ns - first_ns) / 1e9)


async def until(done: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait until ``done()``: marks arrive in memory or in another process's file.

    Polling is the only way to see another process's file; it only decides when
    to look, never what is measured (the marks carry their own times).
    """
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done after {timeout:g} s")
        await asyncio.sleep(POLL_SECONDS)
