"""The JSON API's runs list by attribute (issue 17 item 2): ``GET /api/runs?attributes=``
(a JSON object of scalars, ANDed), with the other filters and with ``q=``; each run's
attributes in the summary; a bad filter a 422 naming the field. Both Worlds."""

from __future__ import annotations

import json

from treadle import set_attributes

from .conftest import Served


async def test_runs_list_filters_by_attributes(served_any: Served) -> None:
    app = served_any.app

    @app.workflow
    async def ship(region: str) -> str:
        set_attributes({"region": region})
        return region

    eu = await app.start(ship, "eu", attributes={"tier": "gold"})
    us = await app.start(ship, "us", attributes={"tier": "gold"})
    other = await app.start(ship, "eu", attributes={"tier": "silver"})
    for run in (eu, us, other):
        await run.result(timeout=15)

    async def listed(**params: str) -> list[str]:
        answer = await served_any.client.get("/api/runs", params=params)
        assert answer.status_code == 200, answer.text
        return [r["run_id"] for r in answer.json()["runs"]]

    gold = json.dumps({"tier": "gold"})
    assert set(await listed(attributes=gold)) == {eu.run_id, us.run_id}
    both = json.dumps({"tier": "gold", "region": "eu"})
    assert await listed(attributes=both) == [eu.run_id]
    assert await listed(attributes=gold, status="failed") == []
    assert set(await listed(attributes=gold, q="ship")) == {eu.run_id, us.run_id}
    assert await listed(attributes=gold, q=other.run_id) == []
    page = (await served_any.client.get("/api/runs", params={"attributes": both})).json()
    assert page["runs"][0]["attributes"] == {"tier": "gold", "region": "eu"}
    detail = (await served_any.client.get(f"/api/runs/{eu.run_id}")).json()
    assert detail["attributes"] == {"tier": "gold", "region": "eu"}


async def test_a_bad_attribute_filter_is_a_422_naming_the_field(served: Served) -> None:
    for bad in ("[1]", "not json", '{"tier": ["gold"]}', '{"bad key": 1}'):
        answer = await served.client.get("/api/runs", params={"attributes": bad})
        assert answer.status_code == 422, answer.text
        error = answer.json()["error"]
        assert error["code"] == "invalid_field"
        assert error["message"].startswith("query.attributes"), error
