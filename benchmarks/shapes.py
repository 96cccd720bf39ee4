"""The benchmark workflows' bodies, written once: every system's app wraps these in its
own decorators, so treadle and each peer run exactly the same code.

``step`` arguments are the system's registered steps; the bodies mark where a step
starts, where a gather joins and where a run ends (``probe``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

from benchmarks import probe

Step = Callable[[str, int], Awaitable[int]]
HANG_SECONDS = 3600.0


async def noop(key: str, i: int) -> int:
    """A no-op step body: it only marks that it started."""
    probe.mark(key, i)
    return i


async def hang(key: str, i: int, *, first_attempt: bool) -> int:
    """A no-op step body that hangs the first time it runs, so its worker can be killed in it.

    It marks ``<i>.<pid>``: the harness kills that process. It hangs on its first attempt
    and only if no earlier body of this step marked: a body run again under the same
    attempt number (treadle's run-ahead: a start that had not committed when the
    worker died is not in the log, so the next try is attempt 1 again) does not hang.
    """
    first = first_attempt and not probe.marked(key, f"{i}.")
    probe.mark(key, f"{i}.{os.getpid()}")
    if first:
        await asyncio.sleep(HANG_SECONDS)
    return i


async def chain(step: Step, key: str, n: int) -> int:
    """n sequential steps (STSO; TTFS and throughput with n=1 and 10)."""
    for i in range(n):
        await step(key, i)
    probe.end(key)
    return n


async def fanout(step: Step, key: str, n: int) -> int:
    """n steps in one gather, then the join."""
    results = await asyncio.gather(*(step(key, i) for i in range(n)))
    probe.join(key)
    return len(results)


async def crash_chain(step: Step, hang_step: Step, key: str, n: int, hang_at: int) -> int:
    """n sequential steps; step ``hang_at`` is ``hang_step`` (recovery)."""
    for i in range(n):
        await (hang_step if i == hang_at else step)(key, i)
    probe.end(key)
    return n


# The scale scenarios' shapes (issue 15 item 5; ``benchmarks.scale``). ``sleep_until`` and
# ``wait`` are the system's durable sleep (until a Unix time) and its wait for a message
# sent from outside (treadle: a hook; DBOS: ``recv``).
SleepUntil = Callable[[float], Awaitable[None]]
Wait = Callable[[str], Awaitable[object]]
ASLEEP = "asleep"


async def sleeper(step: Step, sleep_until: SleepUntil, key: str, due: float) -> int:
    """Mark, sleep durably until ``due`` (Unix seconds), then one step (its start is the wake)."""
    probe.mark(key, ASLEEP)
    await sleep_until(due)
    await step(key, 0)
    probe.end(key)
    return 1


def waiting_label(j: int) -> str:
    return f"w{j}"


async def history(step: Step, wait: Wait, key: str, n: int, waits: int) -> int:
    """n sequential steps (a log of about 2n events), then ``waits`` times: wait for a
    message from outside, one step (its start ends that delivery)."""
    for i in range(n):
        await step(key, i)
    for j in range(waits):
        probe.mark(key, waiting_label(j))
        await wait(f"{key}-{j}")
        await step(key, n + j)
    probe.end(key)
    return n + waits
