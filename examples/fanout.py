"""A fan-out of 100 steps in one ``asyncio.gather``.

treadle run examples/fanout.py:fanout --input '{"n": 100}'
"""

from __future__ import annotations

import asyncio

from treadle import Workflows

app = Workflows()


@app.step
async def noop(i: int) -> int:
    return i


@app.workflow
async def fanout(n: int = 100) -> int:
    results = await asyncio.gather(*(noop(i) for i in range(n)))
    return sum(results)
