"""The scale scenarios (issue 15 item 5), written once for every system: each system's
module hands in how it starts runs, how marks are read and which process to weigh.

- ``workers``: the throughput bursts at 1, 2 and 4 worker processes.
- ``memory``: RSS of one worker process holding many sleeping runs, and of one worker
  process after many one-step runs, sampled after each chunk, with the growth per
  1,000 runs (from the first chunk to the last, so start-up allocation is left out).
- ``sleepers``: many runs started at a paced rate, each sleeping a fixed delay (so
  all of them sleep at once when the first wakes); the lateness of the first step
  after the sleep against its due time.
- ``history``: a run with about 100, 1,000 and 10,000 events (half as many steps),
  then a message from outside (treadle: a hook resume; DBOS: ``send``) until the next
  step starts: what one delivery costs with that log behind it.

RSS is ``VmRSS`` of ``/proc/<pid>/status`` (Linux), in MiB.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks import measure, probe, scenarios, shapes, stats

SCENARIOS = ("workers", "memory", "sleepers", "history")
MIB = 1024 * 1024
SETTLE_SECONDS = 15.0
# How often a scenario reads a probe file of thousands of runs while it waits: the
# marks carry their own times, and a tighter loop would take CPU from the workers.
SLOW_POLL_SECONDS = 0.25
StartChain = Callable[[str, int], Awaitable[Any]]
StartSleeper = Callable[[str, float], Awaitable[Any]]
Read = Callable[[], scenarios.Marks]
# What a fleet's costs are at a moment: counters whose change over a burst, per run, is
# reported (``cpu_s`` of the worker processes, ``xids`` and ``wal_bytes`` of the Postgres
# server, ``stream_msgs`` of the NATS stream).
Costs = Callable[[], Awaitable[dict[str, float]]]
Fleet = Callable[
    [int], contextlib.AbstractAsyncContextManager[tuple[StartChain, Read, Costs | None]]
]
COST_METRICS = {
    "cpu_s": ("worker_cpu_ms_per_run", 1000.0),
    "xids": ("pg_write_xacts_per_run", 1.0),
    "wal_bytes": ("pg_wal_kib_per_run", 1 / 1024),
    "stream_msgs": ("nats_msgs_per_run", 1.0),
}


def rss_mib(pid: int) -> float:
    """The resident set of process ``pid`` now, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / MIB
    raise RuntimeError(f"no VmRSS for process {pid}")


async def settled_rss(pid: int) -> float:
    """RSS once it stops moving (two half-second samples within 0.25 MiB), or after 15 s."""
    deadline = time.monotonic() + SETTLE_SECONDS
    last = rss_mib(pid)
    steady = 0
    while steady < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = rss_mib(pid)
        steady = steady + 1 if abs(now - last) < 0.25 else 0
        last = now
    return last


async def workers(fleet: Fleet, spec: dict[str, Any]) -> scenarios.Metrics:
    """Throughput at each worker-process count: ``runs_per_s@<k>step@<n>w``."""
    out: scenarios.Metrics = {}
    for count in spec["counts"]:
        async with fleet(count) as (start, read, costs):
            for steps, runs in ((1, spec["one"]), (10, spec["ten"])):
                before = await costs() if costs else {}
                rate = await scenarios._burst(start, read, steps, runs, spec["starters"])
                out[f"runs_per_s@{steps}step@{count}w"] = [rate]
                out[f"steps_per_s@{steps}step@{count}w"] = [rate * steps]
                if costs is None:
                    continue
                after = await costs()
                for key, (name, unit) in COST_METRICS.items():
                    if key in after:
                        per_run = (after[key] - before[key]) / runs * unit
                        out[f"{name}@{steps}step@{count}w"] = [per_run]
    return out


def cpu_seconds(pid: int) -> float:
    """User and system CPU time process ``pid`` has used (``/proc/<pid>/stat``)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def postgres_costs(dsn: str) -> dict[str, float]:
    """The server's next transaction id (write transactions so far) and WAL position."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xid, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS wal"
        )
    finally:
        await conn.close()
    assert row is not None
    return {"xids": float(row["xid"]), "wal_bytes": float(row["wal"])}


def _chunks(total: int, parts: int) -> list[int]:
    size = max(total // parts, 1)
    sizes = [size] * (total // size)
    if total % size:
        sizes.append(total % size)
    return sizes


def growth_per_1k(points: list[tuple[int, float]]) -> float:
    """MiB per 1,000 runs from the first sampled point to the last."""
    (n0, r0), (n1, r1) = points[0], points[-1]
    return (r1 - r0) / ((n1 - n0) / 1000) if n1 > n0 else float("nan")


async def _starting(keys: list[str], start: Callable[[str], Awaitable[Any]], width: int) -> None:
    queue = list(reversed(keys))

    async def starter() -> None:
        while queue:
            await start(queue.pop())

    await asyncio.gather(*(starter() for _ in range(width)))


async def memory_sleeping(
    start: StartSleeper, read: Read, pid: int, spec: dict[str, Any]
) -> scenarios.Metrics:
    """RSS of worker ``pid`` as it takes on ``spec["sleeping"]`` runs sleeping an hour."""
    due = time.time() + 3600
    points = [(0, await settled_rss(pid))]
    done = 0
    tag = uuid.uuid4().hex[:6]
    for size in _chunks(spec["sleeping"], spec["chunks"]):
        keys = [f"zz{tag}-{done + i}" for i in range(size)]
        await _starting(keys, lambda key: start(key, due), spec["starters"])
        marks: scenarios.Marks = {}

        def asleep(keys: list[str] = keys, marks: scenarios.Marks = marks) -> bool:
            marks.update(read())
            return all(probe.time_of(marks.get(k, []), shapes.ASLEEP) is not None for k in keys)

        await slowly(asleep, scenarios.RESULT_TIMEOUT, f"{size} runs asleep")
        done += size
        points.append((done, await settled_rss(pid)))
    total = spec["sleeping"]
    return {
        "worker_rss_mib@idle": [points[0][1]],
        f"worker_rss_mib@{total}sleeping": [points[-1][1]],
        "worker_rss_growth_mib_per_1k_sleeping": [growth_per_1k(points[1:])],
    }


async def memory_runs(
    start: StartChain, read: Read, pid: int, spec: dict[str, Any]
) -> scenarios.Metrics:
    """RSS of worker ``pid`` after each chunk of ``spec["runs"]`` one-step runs has ended."""
    points: list[tuple[int, float]] = []
    done = 0
    tag = uuid.uuid4().hex[:6]
    for size in _chunks(spec["runs"], spec["chunks"]):
        keys = [f"mr{tag}-{done + i}" for i in range(size)]
        await _starting(keys, lambda key: start(key, 1), spec["starters"])
        marks: scenarios.Marks = {}

        def ended(keys: list[str] = keys, marks: scenarios.Marks = marks) -> bool:
            marks.update(read())
            return all(probe.time_of(marks.get(k, []), probe.END) is not None for k in keys)

        await slowly(ended, scenarios.RESULT_TIMEOUT, f"{size} one-step runs")
        done += size
        points.append((done, await settled_rss(pid)))
    return {
        f"orchestrator_rss_mib@{spec['runs']}runs": [points[-1][1]],
        "orchestrator_rss_growth_mib_per_1k_runs": [growth_per_1k(points)],
    }


async def sleepers(start: StartSleeper, read: Read, spec: dict[str, Any]) -> scenarios.Metrics:
    """``count`` runs started at ``rate`` per second, each sleeping ``delay`` seconds from
    its start: the first step after the sleep against the due time, in ms."""
    count, rate, delay = spec["count"], spec["rate"], spec["delay_seconds"]
    tag = uuid.uuid4().hex[:6]
    keys = [f"sl{tag}-{i}" for i in range(count)]
    dues: dict[str, float] = {}
    # Wall time to perf_counter (both clocks of this machine; the dues are Unix times).
    offset_s = time.time() - time.perf_counter()
    slots = asyncio.Semaphore(spec["starters"])
    began = time.perf_counter()

    async def one(key: str) -> None:
        async with slots:
            dues[key] = time.time() + delay
            await start(key, dues[key])

    tasks = []
    for i, key in enumerate(keys):
        wait = began + i / rate - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(one(key)))
    await asyncio.gather(*tasks)
    marks: scenarios.Marks = {}

    def ended() -> bool:
        marks.update(read())
        return all(probe.time_of(marks.get(k, []), probe.END) is not None for k in keys)

    await slowly(ended, delay + count / rate + scenarios.RESULT_TIMEOUT, "the sleepers")
    late: list[float] = []
    changes: list[tuple[int, int]] = []
    for key in keys:
        woke = probe.time_of(marks[key], "0")
        slept = probe.time_of(marks[key], shapes.ASLEEP)
        assert woke is not None
        assert slept is not None
        late.append(measure.ms(woke - (dues[key] - offset_s) * 1e9))
        changes += [(slept, 1), (woke, -1)]
    asleep = most = 0
    for _, change in sorted(changes):
        asleep += change
        most = max(most, asleep)
    return {
        "wake_late_p50_ms": [stats.percentile(late, 0.5)],
        "wake_late_p99_ms": [stats.percentile(late, 0.99)],
        "wake_late_max_ms": [max(late)],
        "woke_within_1s_pct": [100.0 * sum(x <= 1000 for x in late) / len(late)],
        "sleeping_at_once": [float(most)],
    }


Send = Callable[[str, int], Awaitable[None]]
StartHistory = Callable[[str, int, int], Awaitable[Any]]


async def history(
    start: StartHistory,
    send: Send,
    read: Read,
    spec: dict[str, Any],
    count_events: Callable[[Any], Awaitable[int]] | None = None,
) -> scenarios.Metrics:
    """Per size: a run of ``events // 2`` steps, then ``waits`` times a message from
    outside to the next step's start (``delivery_ms@<events>events``)."""
    out: scenarios.Metrics = {}
    for events in spec["events"]:
        key = f"hist{events}-{uuid.uuid4().hex[:6]}"
        steps, waits = events // 2, spec["waits"]
        handle = await start(key, steps, waits)
        samples: list[float] = []
        for j in range(waits):
            label = shapes.waiting_label(j)
            await marked(read, key, label)
            await asyncio.sleep(spec["settle_seconds"])  # the wait is in place (not measured)
            sent = time.perf_counter_ns()
            await send(key, j)
            step = str(steps + j)
            samples.append(measure.ms(await marked(read, key, step) - sent))
        out[f"delivery_ms@{events}events"] = samples
        if count_events is not None:
            await marked(read, key, probe.END)
            out[f"log_events@{events}events"] = [float(await count_events(handle))]
    return out


async def marked(read: Read, key: str, label: str) -> int:
    """Until run ``key`` has marked ``label``; when it first did."""
    seen: list[int] = []

    def done() -> bool:
        at = probe.time_of(read().get(key, []), label)
        if at is not None:
            seen.append(at)
        return bool(seen)

    await measure.until(done, scenarios.RESULT_TIMEOUT, f"{key} {label}")
    return seen[0]


async def slowly(done: Callable[[], bool], timeout: float, what: str) -> None:
    """``measure.until`` at ``SLOW_POLL_SECONDS``: for waits on thousands of runs' marks."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done after {timeout:g} s")
        await asyncio.sleep(SLOW_POLL_SECONDS)
