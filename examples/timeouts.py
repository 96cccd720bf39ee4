"""Timeouts: a step whose first attempt hangs past its start-to-close timeout, a long
step that heartbeats and resumes from its last heartbeat, and a timeout block in the
workflow (docs/timeouts.md). A run timeout goes on a spec 9 run:
``await app.start(shop, timeout="1h")``."""

from __future__ import annotations

import asyncio

import treadle
from treadle import StepFailed, Workflows, step_heartbeat, step_metadata

app = Workflows()


@app.step(timeout="1s", max_retries=2)
async def fetch_price(item: str) -> float:
    if step_metadata().attempt == 1:
        await asyncio.sleep(60)  # hangs: the timeout cancels it, and the retry answers
    return 9.5


@app.step(heartbeat_timeout="0.5s", max_retries=2)
async def index_pages(pages: int) -> dict[str, int]:
    meta = step_metadata()
    done = meta.heartbeat_details or 0  # where the last attempt got to
    for page in range(done + 1, pages + 1):
        step_heartbeat(page)
        if meta.attempt == 1 and page == 3:
            await asyncio.Event().wait()  # stuck, no more beats: the lapse ends it
    return {"pages": pages, "resumed_at": done}


@app.step(timeout="2s", max_retries=0)
async def recommend(item: str) -> str:
    await asyncio.sleep(60)  # too slow for the block below, and bounded by its own timeout
    return f"a fancy {item}"


@app.workflow
async def shop(item: str = "lamp") -> dict[str, object]:
    price = await fetch_price(item)
    indexed = await index_pages(5)
    try:
        async with treadle.timeout("0.5s"):  # a durable wait: replays the same way
            pick = await recommend(item)
    except (TimeoutError, StepFailed):
        pick = f"the usual {item}"
    return {"price": price, "indexed": indexed, "pick": pick}
