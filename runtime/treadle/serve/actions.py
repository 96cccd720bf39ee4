"""The serve API's actions: cancel, wake and re-run a run, resume a hook by its token.

Each goes through ``treadle.client`` as the CLI's ``treadle runs cancel|wake`` and
``treadle hooks resume`` do (``ctx.client``: no workflows, no worker), so the API
writes exactly what those write. Auth has already refused the read-only role (403).

- cancel: 409 ``run_ended`` on a run that has ended (also when it ends meanwhile).
- wake: 409 on an ended run; answers how many sleeps were asked to end.
- rerun: a new run of the same workflow with the same stored input (encrypted
  inputs stay sealed), on the run's deployment (or the latest: ``RerunRequest``),
  attribute ``rerun_of``; only an ended run (409 ``run_active`` otherwise). With an
  ``Idempotency-Key`` header the new run's id is derived from it, so a retried POST
  finds the run the first one made instead of making a second.
- resume: ``resume_hook(token, payload, signature)``: 404 for no live hook, 403 for a
  missing or bad signature; 202 with the run id.
"""

from __future__ import annotations

import logging

from starlette.requests import Request

from treadle import client, errors
from treadle.serve import http, models, runsapi
from treadle.serve.context import ServeContext
from treadle.world import ids, records

log = logging.getLogger("treadle.serve")

MAX_IDEMPOTENCY_KEY = 200


async def _live(ctx: ServeContext, run_id: str, verb: str) -> records.RunRecord:
    run = await ctx.world.runs.get(runsapi.check_run_id(run_id))
    if run.is_terminal:
        raise errors.RequestRefused(
            409, "run_ended", f"run {run.run_id} is {run.status} already; nothing to {verb}"
        )
    return run


async def cancel(ctx: ServeContext, request: Request) -> models.ActionResult:
    body = await http.read_json(request, models.CancelRequest)
    run = await _live(ctx, request.path_params["run_id"], "cancel")
    try:
        await ctx.client.get_run(run.run_id).cancel(reason=body.reason)
    except errors.RunExpired:
        raise errors.RequestRefused(
            409, "run_ended", f"run {run.run_id} ended before the cancel was recorded"
        ) from None
    after = await ctx.world.runs.get(run.run_id)
    log.info("run %s: cancelled through treadle serve", run.run_id)
    return models.ActionResult(run_id=run.run_id, status=after.status)


async def wake(ctx: ServeContext, request: Request) -> models.ActionResult:
    body = await http.read_json(request, models.WakeRequest)
    run = await _live(ctx, request.path_params["run_id"], "wake")
    asked = await ctx.client.get_run(run.run_id).wake_up(body.waits)
    after = await ctx.world.runs.get(run.run_id)
    return models.ActionResult(run_id=run.run_id, status=after.status, waits=asked)


def _rerun_id(request: Request, old: str) -> str:
    key = request.headers.get("idempotency-key")
    if key is None:
        return ids.new_run_id()
    key = key.strip()
    if not key or len(key) > MAX_IDEMPOTENCY_KEY:
        raise errors.RequestRefused(
            422,
            "invalid_field",
            f"header Idempotency-Key: 1 to {MAX_IDEMPOTENCY_KEY} characters, not {len(key)}",
        )
    return ids.keyed_run_id(f"treadle-serve:rerun:{old}:{key}")


async def _deployment_for(
    ctx: ServeContext, run: records.RunRecord, wanted: models.RerunRequest
) -> str:
    latest = await ctx.world.deployments.latest()
    if wanted.deployment == "latest":
        return latest or run.deployment_id
    own = await ctx.world.deployments.get(run.deployment_id)
    if own is not None and own.retired and latest is not None:
        return latest
    return run.deployment_id


async def rerun(ctx: ServeContext, request: Request) -> tuple[int, models.RerunResult]:
    body = await http.read_json(request, models.RerunRequest)
    run = await ctx.world.runs.get(runsapi.check_run_id(request.path_params["run_id"]))
    if not run.is_terminal:
        raise errors.RequestRefused(
            409, "run_active", f"run {run.run_id} is {run.status}: cancel it first, or wait"
        )
    new_id = _rerun_id(request, run.run_id)
    deployment = await _deployment_for(ctx, run, body)
    started: records.RunRecord | None = None
    for attempt in (1, 2):
        try:
            started = await client.start_run(
                ctx.world,
                name=run.workflow_name,
                data=run.input,
                deployment_id=deployment,
                spec_version=client.minted_spec_version(ctx.settings, ctx.world),
                run_id=new_id,
                attributes={"rerun_of": run.run_id},
                limits_=ctx.client.limits,
            )
            break
        except errors.DeploymentRetired:
            latest = await ctx.world.deployments.latest()
            if attempt == 2 or latest is None or latest == deployment:
                raise
            deployment = latest  # retired between the read and the write: nothing recorded
        except errors.WorldContractError:
            # The key's run exists with another workflow or input: not this rerun's.
            raise errors.RequestRefused(
                409, "idempotency_key_reused", "this Idempotency-Key made another run already"
            ) from None
    assert started is not None
    log.info("run %s: rerun of %s through treadle serve", started.run_id, run.run_id)
    result = models.RerunResult(
        run_id=started.run_id,
        rerun_of=run.run_id,
        workflow=started.workflow_name,
        deployment_id=started.deployment_id,
    )
    return 201, result


async def resume_hook(ctx: ServeContext, request: Request) -> tuple[int, models.ResumeResult]:
    body = await http.read_json(request, models.ResumeRequest)
    token: str = request.path_params["token"]
    resumed = await ctx.client.resume_hook(token, body.payload, signature=body.signature)
    return 202, models.ResumeResult(run_id=resumed.run_id)
