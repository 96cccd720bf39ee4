"""The inspector's attribute filter (issue 17 item 2) in a real headless Chromium over a
real ``treadle serve``: "tier=gold" in the Attributes field lists only those runs, and
the filter rides in the page's URL as the API's ``attributes=`` JSON."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

from .conftest import FULL_TOKEN
from .test_inspector_browser import browser, chromium, stack, stack_world

__all__ = ["browser", "chromium", "stack", "stack_world"]


async def test_the_attributes_field_filters_the_runs_list(stack: Any) -> None:
    served, page, flows, _ = stack
    gold = [
        await served.app.start(flows["hello"], name, attributes={"tier": "gold", "n": 3})
        for name in ("a", "b")
    ]
    other = await served.app.start(flows["hello"], "c", attributes={"tier": "silver"})
    for run in [*gold, other]:
        await run.result(timeout=20)

    async def listed() -> set[str]:
        return set(await page.js(
            "return [...document.querySelectorAll('table.runs tbody tr')]"
            ".map((tr) => tr.dataset.runId)"
        ))  # fmt: skip

    await page.login(FULL_TOKEN)
    await page.open("/")
    await page.wait(lambda d: len(d.find_elements("css selector", "tbody tr")) == 3, "all three")
    field = (await page.css("#f-attributes"))[0]
    await page.call(field.send_keys, "tier=gold n=3")
    await page.call((await page.css("form.filters button"))[0].click)
    await page.wait(lambda d: len(d.find_elements("css selector", "tbody tr")) == 2, "gold")
    assert await listed() == {r.run_id for r in gold}
    search = parse_qs((await page.js("return location.search")).lstrip("?"))
    assert json.loads(search["attributes"][0]) == {"tier": "gold", "n": 3}
    await page.open("/?attributes=" + json.dumps({"tier": "silver"}))
    await page.wait(lambda d: len(d.find_elements("css selector", "tbody tr")) == 1, "silver")
    assert await listed() == {other.run_id}
    assert await page.js("return document.getElementById('f-attributes').value") == "tier=silver"
