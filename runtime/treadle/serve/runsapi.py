"""The serve API's reads: runs (list, search, one run), its events and its timeline,
and the deployments. Through the World contract only (``runs``, ``events``,
``deployments``); the shapes are ``serve.models``, folded by ``serve.views``.

Paging: ``GET /api/runs`` passes the World's own cursor through; with a search
(``q=``) it scans the World's pages (``SCAN_PAGE`` at a time, at most
``SCAN_LIMIT`` runs per request) and its cursor is ``q.`` + the World cursor of the
page it stopped in and how many of that page it had read, so nothing is skipped
or shown twice. ``GET /api/runs/{id}/events`` pages by slot (``after=``).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass

from pydantic import JsonValue
from starlette.requests import Request

from treadle import childtree, errors, limitview
from treadle.serve import auth, http, models, views
from treadle.serve.context import ServeContext
from treadle.world import attributes as run_attributes
from treadle.world import events, ids, records

SCAN_PAGE = 100
SCAN_LIMIT = 2000
ACTIVE: tuple[records.RunStatus, ...] = ("pending", "running")
ACTIVE_COUNT_LIMIT = 1000
DEPLOYMENTS_LIMIT = 500
# The operator's revision ids: ``<WorkflowDeployment name>-<6 hex>`` (revisions.revision_id).
REVISION_ID = re.compile(r"(?P<name>.+)-[0-9a-f]{6}")
SEARCH_CURSOR = "q."


def check_run_id(run_id: str) -> str:
    if not ids.is_run_id(run_id):
        raise errors.RequestRefused(
            404, "run_not_found", f"no run {run_id!r} (a run id is wrun_ and 26 characters)"
        )
    return run_id


def shows_tokens(request: Request) -> bool:
    """Hook tokens resume hooks: only the full role sees them."""
    who = auth.principal(request)
    return who is not None and who.may_act


async def read_log(ctx: ServeContext, run_id: str) -> list[events.LoggedEvent]:
    out: list[events.LoggedEvent] = []
    after = 0
    while True:
        page = await ctx.world.events.list(run_id, after_slot=after)
        out.extend(page.events)
        if not page.has_more or not page.events:
            return out
        after = page.cursor


@dataclass(frozen=True)
class _Scan:
    world_cursor: str | None
    skip: int

    def encode(self) -> str:
        raw = json.dumps({"c": self.world_cursor, "s": self.skip}).encode()
        return SEARCH_CURSOR + base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> _Scan:
        bad = errors.RequestRefused(422, "invalid_field", "query.cursor: not a cursor of this list")
        try:
            body = text[len(SEARCH_CURSOR) :]
            data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except (binascii.Error, ValueError):
            raise bad from None
        if not isinstance(data, dict):
            raise bad
        world_cursor, skip = data.get("c"), data.get("s")
        if not (world_cursor is None or isinstance(world_cursor, str)):
            raise bad
        if not isinstance(skip, int) or not 0 <= skip < SCAN_PAGE:
            raise bad
        return cls(world_cursor, skip)


def _matches(run: records.RunRecord, text: str) -> bool:
    needle = text.lower()
    return any(needle in v.lower() for v in (run.run_id, run.workflow_name, run.deployment_id))


def _fits(run: records.RunRecord, query: models.RunsQuery) -> bool:
    return (
        (query.status is None or run.status == query.status)
        and (query.workflow is None or run.workflow_name == query.workflow)
        and (query.deployment is None or run.deployment_id == query.deployment)
        and run_attributes.matches(run.attributes, _attribute_filter(query))
    )


def _attribute_filter(query: models.RunsQuery) -> dict[str, JsonValue] | None:
    """``attributes=`` as a checked filter; 422 naming what is wrong (issue 17 item 2)."""
    if query.attributes is None:
        return None
    try:
        data = json.loads(query.attributes)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise errors.RequestRefused(
            422, "invalid_field", 'query.attributes: a JSON object, e.g. {"tier": "gold"}'
        )
    try:
        return run_attributes.check_filter(data)
    except errors.WorldContractError as exc:
        reason = str(exc).removeprefix("runs.list attribute filter")
        raise errors.RequestRefused(422, "invalid_field", f"query.attributes{reason}") from None


async def _page(
    ctx: ServeContext, query: models.RunsQuery, limit: int, cursor: str | None
) -> records.RunPage:
    try:
        return await ctx.world.runs.list(
            status=query.status,
            workflow_name=query.workflow,
            deployment_id=query.deployment,
            limit=limit,
            cursor=cursor,
            attributes=_attribute_filter(query),
        )
    except errors.WorldContractError:
        if cursor is None:
            raise
        raise errors.RequestRefused(
            422, "invalid_field", "query.cursor: not a cursor of this list"
        ) from None


async def _search(ctx: ServeContext, query: models.RunsQuery, text: str) -> models.RunList:
    if ids.is_run_id(text):
        try:
            run = await ctx.world.runs.get(text)
        except errors.RunNotFound:
            return models.RunList(runs=[], next_cursor=None)
        found = [views.summary(run)] if _fits(run, query) else []
        return models.RunList(runs=found, next_cursor=None)
    scan = _Scan(None, 0) if query.cursor is None else _Scan.decode(query.cursor)
    matched: list[models.RunSummary] = []
    scanned = 0
    while True:
        page = await _page(ctx, query, SCAN_PAGE, scan.world_cursor)
        for index, run in enumerate(page.runs):
            if index < scan.skip:
                continue
            scanned += 1
            if _matches(run, text):
                matched.append(views.summary(run))
            if len(matched) == query.limit or scanned >= SCAN_LIMIT:
                following = index + 1
                if following < len(page.runs):
                    return models.RunList(
                        runs=matched, next_cursor=_Scan(scan.world_cursor, following).encode()
                    )
                more = None if page.next_cursor is None else _Scan(page.next_cursor, 0).encode()
                return models.RunList(runs=matched, next_cursor=more)
        if page.next_cursor is None:
            return models.RunList(runs=matched, next_cursor=None)
        scan = _Scan(page.next_cursor, 0)


async def list_runs(ctx: ServeContext, request: Request) -> models.RunList:
    query = http.query(request, models.RunsQuery)
    if query.q is not None and query.q.strip():
        return await _search(ctx, query, query.q.strip())
    if query.cursor is not None and query.cursor.startswith(SEARCH_CURSOR):
        raise errors.RequestRefused(
            422, "invalid_field", "query.cursor: a search's cursor; send it with its q="
        )
    page = await _page(ctx, query, query.limit, query.cursor)
    runs = await limitview.annotate(ctx.world, page.runs)  # what each waits on, if a limit
    return models.RunList(runs=[views.summary(r) for r in runs], next_cursor=page.next_cursor)


async def get_run(ctx: ServeContext, request: Request) -> models.RunDetail:
    run_id = check_run_id(request.path_params["run_id"])
    (run,) = await limitview.annotate(ctx.world, [await ctx.world.runs.get(run_id)])
    log = await read_log(ctx, run_id)  # whole: its children are in it (child workflows)
    detail = views.detail(run, log, show_tokens=shows_tokens(request), keys=ctx.client.payload_keys)
    family = await childtree.tree(ctx.world, run, log)
    return detail.model_copy(update=views.tree_fields(family))


async def run_events(ctx: ServeContext, request: Request) -> models.EventList:
    run_id = check_run_id(request.path_params["run_id"])
    query = http.query(request, models.EventsQuery)
    await ctx.world.runs.get(run_id)  # 404 for an unknown run, not an empty list
    page = await ctx.world.events.list(run_id, after_slot=query.after, limit=query.limit)
    show, keys = shows_tokens(request), ctx.client.payload_keys
    return models.EventList(
        events=[views.event_out(e, show_tokens=show, keys=keys) for e in page.events],
        next_cursor=page.cursor if page.has_more else None,
    )


async def run_timeline(ctx: ServeContext, request: Request) -> models.Timeline:
    run_id = check_run_id(request.path_params["run_id"])
    run = await ctx.world.runs.get(run_id)
    return views.timeline(run, await read_log(ctx, run_id))


def revision_name(deployment_id: str) -> str:
    found = REVISION_ID.fullmatch(deployment_id)
    return found.group("name") if found else deployment_id


def _workflows(catalogue: object) -> list[str]:
    if isinstance(catalogue, dict):
        return sorted(str(k) for k in catalogue)
    return []


async def list_deployments(ctx: ServeContext, request: Request) -> models.DeploymentList:
    http.query(request, models.NoQuery)
    deployments = ctx.world.deployments
    latest = await deployments.latest()
    listed = await deployments.list(limit=DEPLOYMENTS_LIMIT)
    out: list[models.Deployment] = []
    groups: dict[str, models.DeploymentGroup] = {}
    for record in listed:
        active = 0
        if not record.retired:
            active = await ctx.world.runs.count(
                statuses=ACTIVE, deployment_id=record.deployment_id, limit=ACTIVE_COUNT_LIMIT
            )
        name = revision_name(record.deployment_id)
        out.append(
            models.Deployment(
                deployment_id=record.deployment_id,
                name=name,
                created_at=record.created_at,
                retired=record.retired,
                promoted=record.promoted,
                latest=record.deployment_id == latest,
                workflows=_workflows(record.catalogue),
                active_runs=active,
            )
        )
        group = groups.get(name) or models.DeploymentGroup(name=name, latest=None, revisions=[])
        groups[name] = group.model_copy(
            update={
                "revisions": [*group.revisions, record.deployment_id],
                "latest": record.deployment_id if record.deployment_id == latest else group.latest,
            }
        )
    return models.DeploymentList(latest=latest, deployments=out, revisions=list(groups.values()))
