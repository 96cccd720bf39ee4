"""The Vercel Workflow Python SDK's benchmark workflows (the shapes treadle's app has).

Workflow bodies run in the SDK's sandbox, which refuses clocks; ``benchmarks.probe``
and ``benchmarks.shapes`` are passed through from the host so the body can mark its
join and its end.

``serve`` (``python -m benchmarks.systems.vercel_bench [KEY N HANG_AT]``; not this
module, whose workflows must be imported under their own name) is a process on the
local World (``WORKFLOW_LOCAL_DATA_DIR``) that starts ``crash_chain`` for KEY, if
given, and stays up until SIGTERM (the recovery attempt). With ``BENCH_HANG`` set,
``hang_once`` hangs, so the process can be killed inside it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from vercel.workflow import SandboxPolicy, Workflows, start

from benchmarks import shapes

READY = "vercel process ready"
HANG_ENV = "BENCH_HANG"

# The bodies (benchmarks.shapes) come from the host, as does the probe they mark with.
PASSTHROUGH = frozenset({"benchmarks.probe", "benchmarks.shapes"})
wf = Workflows(sandbox_policy=SandboxPolicy(passthrough_modules=PASSTHROUGH))


@wf.step
async def noop(key: str, i: int) -> int:
    return await shapes.noop(key, i)


@wf.step
async def hang_once(key: str, i: int) -> int:
    return await shapes.hang(key, i, first_attempt=bool(os.environ.get(HANG_ENV)))


@wf.workflow
async def chain(key: str, n: int) -> int:
    return await shapes.chain(noop, key, n)


@wf.workflow
async def fanout(key: str, n: int) -> int:
    return await shapes.fanout(noop, key, n)


@wf.workflow
async def crash_chain(key: str, n: int, hang_at: int) -> int:
    return await shapes.crash_chain(noop, hang_once, key, n, hang_at)


# Looked up by name by the driver; typed loosely, as ``start`` is generic over each one.
WORKFLOWS: dict[str, Any] = {"chain": chain, "fanout": fanout, "crash_chain": crash_chain}


async def serve(argv: list[str]) -> None:
    from vercel.workflow._internal import world

    world.get_world()
    if argv:
        key, n, hang_at = argv[0], int(argv[1]), int(argv[2])
        await start(crash_chain, key, n, hang_at)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print(READY, file=sys.stderr, flush=True)
    await stop.wait()
