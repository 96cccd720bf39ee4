"""Runs started from code, shown as WorkflowRun objects (``spec.mirrorRuns``).

The status sync calls ``mirrors`` for each run creation the World reports (is it
worth a read?) and ``mirror`` for those that are: a WorkflowRun annotated with
the run id, adopted by ``runs.start`` like any other (review R5 (d), (e)). A run
fired by a WorkflowSchedule is shown as that schedule's (``schedulesync.mirror_run``).
Mirrors carry the run's attributes that fit as labels (``attrlabels``).
Wired in ``main.run``.
"""

from __future__ import annotations

import logging
from typing import Any

from treadle import errors as engine_errors
from treadle.world import contract
from treadle_operator import admission, attrlabels, binding, models, schedules, schedulesync
from treadle_operator.runs import INPUT_OMITTED, MIRRORED, PLURAL
from treadle_operator.state import State

log = logging.getLogger("treadle.operator.mirrored")

mirror_name = binding.mirror_name


def mirrors(state: State, deployment_id: str | None) -> bool:
    """Would a run created on ``deployment_id`` be mirrored (worth a read)? Unknown
    (the World did not say): while any WorkflowDeployment mirrors (review R5 (d)) or
    any WorkflowSchedule is served. A revision a WorkflowSchedule is pinned to: yes
    (its firings are shown, whatever ``mirrorRuns`` says)."""
    if deployment_id is None:
        return bool(state.schedules) or any(o.mirror_runs for o in state.owners.values())
    if any(s.deployment_id == deployment_id for s in state.schedules.values()):
        return True
    owner = state.owners.get(deployment_id)
    return owner is not None and owner.mirror_runs


async def mirror(state: State, world: contract.World, run_id: str) -> None:
    """Show a run started from code as a WorkflowRun, when its deployment asks for it."""
    try:
        run = await world.runs.get(run_id)
    except engine_errors.RunNotFound:
        return
    if binding.is_bound(run):
        return
    if schedules.mirror_of(run) is not None:  # fired by a WorkflowSchedule: its mirror only
        scheduled = schedulesync.owner_of(state, run)
        if scheduled is not None:  # (else its schedule's next sync mirrors it)
            await schedulesync.mirror_run(state, scheduled.body, run)
        return
    owner = state.owners.get(run.deployment_id)
    if owner is None or not owner.mirror_runs:
        return
    stored = run.input if isinstance(run.input, dict) else {}
    args, kwargs = stored.get("args") or [], stored.get("kwargs") or {}
    name = mirror_name(run.workflow_name, run_id)
    body: dict[str, Any] = {
        "apiVersion": models.API_VERSION,
        "kind": "WorkflowRun",
        "metadata": {
            "name": name,
            "annotations": {MIRRORED: run_id},
            "labels": {**attrlabels.labels(run.attributes), "treadle.dev/deployment": owner.name},
        },
        "spec": {
            "deployment": owner.name,
            "workflow": run.workflow_name,
            "input": args if args else kwargs,
            "ttlSecondsAfterFinished": owner.mirror_ttl_seconds,
        },
    }
    shown = body["spec"]["input"]
    if admission.inline_size_problem(shown) is not None:  # the webhook refuses it inline
        del body["spec"]["input"]
        body["metadata"]["annotations"][INPUT_OMITTED] = (
            f"{admission.input_size(shown)} bytes: over the inline limit, see the World's run"
        )
    try:
        await state.kube.create(PLURAL, owner.namespace, body)
    except Exception as exc:
        if getattr(exc, "status", None) != 409:
            raise
    log.info(
        "mirrored run %s as WorkflowRun %s/%s", run_id, owner.namespace, body["metadata"]["name"]
    )
