"""The inspector's view of a run's streams (docs/streams.md, docs/serve.md) in a real
headless Chromium over a real ``treadle serve``: the run page lists the run's streams
(name, chunk count, closed), "Show chunks" reads one live over the API's server-sent
events, a chunk the step writes while the page is open appears without a reload, and
the stream's end is shown. Values reach the page as text (a chunk holding markup
shows it, never renders it). A run that wrote no stream shows no streams card."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from treadle import get_writable

from .conftest import FULL_TOKEN
from .test_inspector_browser import _visible, browser, chromium, stack, stack_world

__all__ = ["browser", "chromium", "stack", "stack_world"]

MARKUP = "<img src=x onerror=alert(1)>"


@pytest.mark.parametrize("stack_world", ["local", "postgres+nats"], indirect=True)
async def test_the_run_page_shows_a_streams_chunks_live_and_its_end(stack: Any) -> None:
    served, page, flows, _ = stack
    app = served.app
    more = asyncio.Event()

    @app.step
    async def generate(prompt: str) -> str:
        async with get_writable("tokens") as tokens:
            await tokens.write({"word": prompt})
            await tokens.write(MARKUP)
            await tokens.flush()  # on the page while the step waits
            await more.wait()
            await tokens.write("last")
        progress = get_writable("progress")
        await progress.write(1)
        return "done"

    @app.workflow
    async def answer(prompt: str) -> str:
        return await generate(prompt)

    run = await app.start(answer, "durable")
    plain = await app.start(flows["hello"], "no streams")
    assert await plain.result(timeout=20) == "hello, no streams"

    await page.login(FULL_TOKEN)
    await page.wait(_visible("table.runs"), "the runs list")
    await page.open(f"/runs/{plain.run_id}")
    await page.wait(_visible('li.bar[data-name="greet"]'), "the plain run's page")
    assert await page.js("return document.querySelector('.streams-card').hidden") is True

    await page.open(f"/runs/{run.run_id}")
    item = 'ul.streams li[data-stream="tokens"]'
    await page.wait(_visible(item), "the tokens stream in the streams card")
    await page.wait_text(item, "2 chunks", "the stream's count")
    await page.click(f"{item} button")
    await page.wait(
        lambda d: len(d.find_elements("css selector", f"{item} ol.chunks li")) == 2,
        "the two chunks written so far",
    )
    shown = await page.texts(f"{item} ol.chunks li")
    assert "#0" in shown[0] and '"word": "durable"' in shown[0] and "attempt 1" in shown[0]
    assert MARKUP in shown[1]  # as text: the chunk's markup is never rendered
    assert await page.js("return document.querySelectorAll('.chunks img').length") == 0
    await page.js("document.querySelector('.streams-card').scrollIntoView()")
    await page.shot("run-streams-live")

    more.set()  # the step writes its last chunk and closes: live, no reload
    await page.wait(
        lambda d: len(d.find_elements("css selector", f"{item} ol.chunks li")) == 3,
        "the chunk written while the page was open",
    )
    assert '"last"' in (await page.texts(f"{item} ol.chunks li"))[2]
    await page.wait(
        lambda d: d.execute_script(
            "const s = document.querySelector(arguments[0]);"
            "return s && s.dataset.ended === 'true' && s.innerText",
            f"{item} .stream-state",
        ),
        "the stream's end",
    )
    (state,) = await page.texts(f"{item} .stream-state")
    assert state == "Closed by its writer: 3 chunks."
    assert await run.result(timeout=20) == "done"
    await page.wait_text('ul.streams li[data-stream="progress"]', "1 chunk", "the second stream")
    await page.wait_text(item, "3 chunks · closed", "the closed stream's count")
    assert await page.js("return performance.getEntriesByType('navigation').length") == 1
    await page.js("document.querySelector('.streams-card').scrollIntoView()")
    await page.shot("run-streams-closed")
