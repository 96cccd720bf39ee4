"""The OpenAPI 3.1 document of the serve API (``GET /api/openapi.json``).

Written from ``serve.models`` (pydantic's JSON Schema of each model under
``components.schemas``) and the table ``OPERATIONS`` below, which names each
route's method, path, parameters, body and answers; ``serve.api`` builds its
routes from the same table, so a route cannot be served undocumented or
documented unserved (a test checks both ways and validates the document).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from treadle import __version__
from treadle.serve import models, streamsapi

REF = "#/components/schemas/{model}"
ERROR_ANSWERS = {
    "400": "Malformed JSON",
    "401": "No or bad credentials",
    "403": "Read-only role on an action",
    "404": "Unknown run or hook",
    "409": "Conflict with the run's state",
    "413": "Body too large",
    "422": "Invalid field",
}


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    operation_id: str
    summary: str
    response: type[BaseModel] | None
    status: int = 200
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    path_params: tuple[str, ...] = ()
    stream: bool = False
    tags: tuple[str, ...] = ("runs",)
    extra_headers: dict[str, str] = field(default_factory=dict)


RUN = ("run_id",)
OPERATIONS: tuple[Operation, ...] = (
    Operation("GET", "/healthz", "health", "Liveness (no auth)", models.Health, tags=("meta",)),
    Operation(
        "GET", "/api/runs", "listRuns", "Runs, newest first, filtered and paged",
        models.RunList, query=models.RunsQuery,
    ),
    Operation(
        "GET", "/api/runs/{run_id}", "getRun", "One run, with what it waits on",
        models.RunDetail, path_params=RUN,
    ),
    Operation(
        "GET", "/api/runs/{run_id}/events", "listRunEvents", "The run's event log, by slot",
        models.EventList, query=models.EventsQuery, path_params=RUN,
    ),
    Operation(
        "GET", "/api/runs/{run_id}/timeline", "getRunTimeline",
        "Steps, sleeps and hooks as bars with their attempts", models.Timeline, path_params=RUN,
    ),
    Operation(
        "POST", "/api/runs/{run_id}/cancel", "cancelRun", "Cancel a run",
        models.ActionResult, body=models.CancelRequest, path_params=RUN,
    ),
    Operation(
        "POST", "/api/runs/{run_id}/wake", "wakeRun", "End the run's sleeps now",
        models.ActionResult, body=models.WakeRequest, path_params=RUN,
    ),
    Operation(
        "POST", "/api/runs/{run_id}/rerun", "rerunRun",
        "A new run of the same workflow with the same input", models.RerunResult, status=201,
        body=models.RerunRequest, path_params=RUN,
        extra_headers={"Idempotency-Key": "A retried POST with the same key makes no second run"},
    ),
    Operation(
        "POST", "/api/hooks/{token}/resume", "resumeHook", "Resume the hook holding a token",
        models.ResumeResult, status=202, body=models.ResumeRequest, path_params=("token",),
        tags=("hooks",),
    ),
    Operation(
        "GET", "/api/deployments", "listDeployments", "Deployments, their revisions, the latest",
        models.DeploymentList, tags=("deployments",),
    ),
    Operation(
        "GET", "/api/runs/{run_id}/stream", "streamRun",
        "Server-sent events: the run has new events (data: StreamEvent)", models.StreamEvent,
        query=models.StreamQuery, path_params=RUN, stream=True,
    ),
    Operation(
        "GET", "/api/stream", "streamRuns",
        "Server-sent events: some run changed (data: StreamEvent; event: resync)",
        models.StreamEvent, stream=True,
    ),
    # Issue 17 item 6: streams (serve/streamsapi.py, docs/streams.md).
    Operation(
        "GET", "/api/runs/{run_id}/streams", "listRunStreams",
        "The run's streams: name, chunk count, closed", streamsapi.StreamList, path_params=RUN,
    ),
    Operation(
        "GET", "/api/runs/{run_id}/streams/{name}", "streamRunChunks",
        "Server-sent events: the stream's chunks, live (id: index; event: end)", None,
        query=streamsapi.StreamChunksQuery, path_params=("run_id", "name"), stream=True,
    ),
    Operation(
        "GET", "/api/openapi.json", "openapi", "This document", None, tags=("meta",),
    ),
)  # fmt: skip


def _schemas() -> dict[str, Any]:
    wanted: list[type[BaseModel]] = [models.ErrorResponse]
    for op in OPERATIONS:
        wanted += [m for m in (op.response, op.body) if m is not None]
    unique = list(dict.fromkeys(wanted))
    _, top = models_json_schema([(m, "serialization") for m in unique], ref_template=REF)
    defs: dict[str, Any] = top.get("$defs", {})
    # Request bodies are read in validation mode; their schemas are the same models'.
    for m in unique:
        if m in {op.body for op in OPERATIONS}:
            defs[m.__name__] = m.model_json_schema(ref_template=REF, mode="validation")
    return defs


def _query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    schema = model.model_json_schema(ref_template=REF)
    required = set(schema.get("required", []))
    params = []
    for name, prop in schema.get("properties", {}).items():
        description = prop.pop("description", None)
        param: dict[str, Any] = {
            "name": name, "in": "query", "required": name in required, "schema": prop,
        }  # fmt: skip
        if description:
            param["description"] = description
        params.append(param)
    return params


def _operation(op: Operation) -> dict[str, Any]:
    params: list[dict[str, Any]] = [
        {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
        for p in op.path_params
    ]
    if op.query is not None:
        params += _query_parameters(op.query)
    params += [
        {"name": h, "in": "header", "required": False, "schema": {"type": "string"},
         "description": d}
        for h, d in op.extra_headers.items()
    ]  # fmt: skip
    if op.stream:
        content: dict[str, Any] = {
            "text/event-stream": {
                "schema": {"type": "string"},
                "x-event-data": {"$ref": REF.format(model=models.StreamEvent.__name__)},
            }
        }
    elif op.response is None:
        content = {"application/json": {"schema": {"type": "object"}}}
    else:
        content = {"application/json": {"schema": {"$ref": REF.format(model=op.response.__name__)}}}
    responses: dict[str, Any] = {str(op.status): {"description": op.summary, "content": content}}
    error = {"application/json": {"schema": {"$ref": REF.format(model="ErrorResponse")}}}
    for code, why in ERROR_ANSWERS.items():
        if code == "403" and op.method == "GET":
            continue
        responses[code] = {"description": why, "content": error}
    out: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "tags": list(op.tags),
        "parameters": params,
        "responses": responses,
    }
    if op.stream:  # an EventSource cannot send headers: ?access_token= is accepted here
        out["security"] = [{"bearer": []}, {"access_token": []}]
    if op.path == "/healthz":
        out["security"] = []
        out["responses"] = {"200": responses["200"]}
    if op.body is not None:
        ref = {"$ref": REF.format(model=op.body.__name__)}
        out["requestBody"] = {"required": False, "content": {"application/json": {"schema": ref}}}
    return out


def document() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "treadle serve",
            "version": __version__,
            "description": "The JSON API of treadle serve: runs, their events and timeline, "
            "actions, hooks, deployments, and server-sent events. Errors are "
            '{"error": {"code", "message"}}.',
        },
        "paths": paths,
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "access_token": {
                    "type": "apiKey",
                    "in": "query",
                    "name": "access_token",
                    "description": "Stream routes only (EventSource).",
                },
            },
        },
        "security": [{"bearer": []}],
    }
