"""How many deliveries a worker takes at once: ``TREADLE_WORKER_CONCURRENCY``, or derived.

A delivery in flight is a coroutine on the worker's event loop: an async step body
awaiting I/O, an orchestrator delivery awaiting the World. None of them holds a CPU
while it waits, so a fixed cap of 32 in flight (the earlier default) bounded a
fan-out's width, not the worker's work: a 1,000-way fan-out ran 32 branches at a
time while the loop sat idle. The derived default sizes the in-flight step messages
from what the worker can actually run at once:

- every step body ``async def`` (they share the loop): ``ASYNC_PER_CPU`` per CPU of the
  process, at least ``MIN_CONCURRENCY`` and at most ``MAX_ASYNC_CONCURRENCY`` (each
  delivery in flight holds a queue message and a few kilobytes; the World's own pool
  paces what reaches the database);
- any synchronous step body (it runs on a thread of the loop's default executor, which
  has ``min(32, CPUs + 4)`` threads): twice that many threads, at least
  ``MIN_CONCURRENCY``, so each thread has the next body ready without holding
  messages whose bodies could only queue for a thread (their leases would run while
  they wait).

``TREADLE_WORKER_CONCURRENCY`` (or ``treadle worker --concurrency N``, which wins) sets
it outright.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from treadle.sdk import functions
from treadle.settings import Settings

MIN_CONCURRENCY = 32
ASYNC_PER_CPU = 256
MAX_ASYNC_CONCURRENCY = 1024


def cpus() -> int:
    """The CPUs this process may run on (its affinity, where the platform tells)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def executor_threads(cpu_count: int) -> int:
    """The threads of asyncio's default executor (``ThreadPoolExecutor``'s default)."""
    return min(32, cpu_count + 4)


def derived(steps: Mapping[str, functions.StepFunction[Any, Any]], cpu_count: int) -> int:
    """The default for a worker of these step functions on ``cpu_count`` CPUs."""
    if any(not fn.is_async for fn in steps.values()):
        return max(MIN_CONCURRENCY, 2 * executor_threads(cpu_count))
    return min(MAX_ASYNC_CONCURRENCY, max(MIN_CONCURRENCY, ASYNC_PER_CPU * cpu_count))


def worker_concurrency(
    settings: Settings,
    steps: Mapping[str, functions.StepFunction[Any, Any]],
    requested: int | None = None,
) -> int:
    """``requested`` (a flag or an argument), else the setting, else ``derived``."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"concurrency must be at least 1, got {requested}")
        return requested
    if settings.TREADLE_WORKER_CONCURRENCY is not None:
        return settings.TREADLE_WORKER_CONCURRENCY
    return derived(steps, cpus())
