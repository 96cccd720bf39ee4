"""The OpenAPI document (issue 13 item 1): a valid OpenAPI 3.1 document generated from the
pydantic models, naming every route the app serves, and the live answers match it."""

from __future__ import annotations

from typing import Any

import jsonschema
from openapi_spec_validator import validate
from starlette.routing import Route

from treadle.serve.app import create_app

from .conftest import Served
from .flows import define, wait_for_event


def _check(document: dict[str, Any], model: str, value: Any) -> None:
    schema = {"$ref": f"#/components/schemas/{model}", "components": document["components"]}
    jsonschema.Draft202012Validator(schema).validate(value)


async def test_the_openapi_document_is_valid_and_names_every_route(served: Served) -> None:
    """GET /api/openapi.json is a valid OpenAPI 3.1 document; each of its component schemas
    is a valid JSON Schema; its paths are exactly the app's JSON routes."""
    response = await served.reader.get("/api/openapi.json")
    assert response.status_code == 200
    document = response.json()
    validate(document)
    assert document["openapi"] == "3.1.0"
    for schema in document["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    app = create_app(served.ctx)
    served_paths = {
        r.path.replace("{token:path}", "{token}")
        for r in app.routes
        if isinstance(r, Route) and (r.path.startswith("/api/") or r.path == "/healthz")
    }
    assert served_paths == set(document["paths"])
    stream_security = document["paths"]["/api/stream"]["get"]["security"]
    assert {"access_token": []} in stream_security
    assert "access_token" not in str(document["paths"]["/api/runs"]["get"].get("security"))


async def test_live_answers_match_the_documented_schemas(served: Served) -> None:
    """The list, a run, its events and timeline, the deployments, an action's result and
    an error each validate against the schema the document gives them."""
    document = (await served.client.get("/api/openapi.json")).json()
    flows = define(served.app)
    run = await served.app.start(flows.flaky, "doc")
    await run.result(timeout=15)
    waiting = await served.app.start(flows.approve, "tok-doc-1")
    await wait_for_event(served.world, waiting.run_id, "hook_created")
    await served.world.deployments.register("local", catalogue={"flaky": {"params": []}})
    answers = {
        "RunList": "/api/runs",
        "RunDetail": f"/api/runs/{waiting.run_id}",
        "EventList": f"/api/runs/{run.run_id}/events",
        "Timeline": f"/api/runs/{run.run_id}/timeline",
        "DeploymentList": "/api/deployments",
    }
    for model, path in answers.items():
        response = await served.client.get(path)
        assert response.status_code == 200, (path, response.text)
        _check(document, model, response.json())
    rerun = await served.client.post(f"/api/runs/{run.run_id}/rerun")
    _check(document, "RerunResult", rerun.json())
    cancel = await served.client.post(f"/api/runs/{waiting.run_id}/cancel")
    _check(document, "ActionResult", cancel.json())
    error = await served.client.get("/api/runs/wrun_01ARZ3NDEKTSV4RRFFQ69G5FAV")
    assert error.status_code == 404
    _check(document, "ErrorResponse", error.json())
