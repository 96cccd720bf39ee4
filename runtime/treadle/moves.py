"""Moving a run to another deployment revision (issue 11 item 5): one sequence, one place.

``move_run`` is what ``treadle runs move`` calls, ``move_runs`` (the same per run) what
the operator's ``MoveRuns`` calls:

1. **Compatibility.** The run's workflow must declare the same non-empty tag
   (``@app.workflow(compatible="orders-v3")``) in the catalogues both deployments'
   workers registered (``deployments.get(id).catalogue``), else ``RunNotMovable``
   and nothing is written. The tag is the app's promise that the new code replays
   logs the old code wrote.
2. **The move.** ``runs.repin`` (``run_repinned`` and the run row's deployment, in
   one transaction, only from the deployment the run is on, only while it has not
   ended, only to a registered, unretired deployment: ``RunNotRepinned``).
3. **The recovery wake.** An orchestrator message with ``recovery=True`` to the new
   deployment: its orchestrator replays the log, re-arms the open sleeps' timers on
   its own subject and re-sends the steps it owes (``orchestrator.waits``,
   ``decisions.steps_to_resend``). A delivery still reaching the old deployment
   (a timer it scheduled, a step's completion) reads ``run_repinned`` in the log
   and re-routes to the new one (``orchestrator.pinning``), so the old revision
   keeps its orchestrator until its queue is empty.

A retried move converges: when the run is already on the target (a first call's
wake was lost), the wake is sent again and the move reported as done.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from treadle import errors
from treadle.sdk import catalogue
from treadle.world import contract, messages, records

log = logging.getLogger("treadle.moves")

MoveOutcome = Literal["moved", "already_there"]


@dataclass(frozen=True, slots=True)
class Moved:
    """A run now on ``to_deployment`` (``outcome`` says whether this call moved it)."""

    run: records.RunRecord
    from_deployment: str
    to_deployment: str
    outcome: MoveOutcome


def compatibility(
    workflow: str,
    source: records.DeploymentRecord | None,
    target: records.DeploymentRecord | None,
) -> tuple[str | None, str | None]:
    """The tag ``workflow`` declares in each deployment's catalogue (None: none)."""

    def tag(record: records.DeploymentRecord | None) -> str | None:
        entries = record.catalogue if record is not None else None
        entry = entries.get(workflow) if isinstance(entries, dict) else None
        return catalogue.compatible_of(entry)

    return tag(source), tag(target)


def why_incompatible(
    workflow: str,
    source: records.DeploymentRecord | None,
    target: records.DeploymentRecord | None,
) -> str | None:
    """Why a run of ``workflow`` may not move from ``source`` to ``target``; None when it may."""
    old, new = compatibility(workflow, source, target)
    source_id = source.deployment_id if source is not None else "its deployment"
    target_id = target.deployment_id if target is not None else "the target"
    if target is not None and not isinstance(target.catalogue, dict):
        return f"deployment {target_id} registered no catalogue (no worker of it has started)"
    if target is not None and workflow not in target.catalogue:  # type: ignore[operator]
        return f"deployment {target_id} does not serve workflow {workflow}"
    if old is None:
        return f"workflow {workflow} declares no compatibility tag in deployment {source_id}"
    if new is None:
        return f"workflow {workflow} declares no compatibility tag in deployment {target_id}"
    if old != new:
        return (
            f"workflow {workflow} is compatible={old!r} in deployment {source_id} but "
            f"compatible={new!r} in deployment {target_id}"
        )
    return None


async def move_run(
    world: contract.World,
    run_id: str,
    *,
    to_deployment: str,
    reason: str | None = None,
) -> Moved:
    """Move ``run_id`` to ``to_deployment`` and wake it there (see the module docstring).

    Raises ``RunNotMovable`` (tags differ), ``RunNotRepinned`` (ended, moved by another
    mover, unknown or retired target), ``RunNotFound``; nothing is written then.
    """
    run = await world.runs.get(run_id)
    if run.deployment_id == to_deployment:
        if not run.is_terminal:
            await _wake(world, run)  # a retried move: the first one's wake may be lost
        return Moved(run, to_deployment, to_deployment, "already_there")
    source = await world.deployments.get(run.deployment_id)
    target = await world.deployments.get(to_deployment)
    return await _move(world, run, source, target, to_deployment, reason)


@dataclass(slots=True)
class Tally:
    """What ``move_runs`` did: runs moved, and the runs left behind by why."""

    moved: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


async def move_runs(
    world: contract.World,
    run_ids: Iterable[str],
    *,
    from_deployment: str,
    to_deployment: str,
    reason: str | None = None,
) -> Tally:
    """``move_run`` for many runs of one deployment (the operator's ``MoveRuns``), reading
    both deployments once. A run that ended or moved meanwhile is neither moved nor
    skipped; one whose workflow is not compatible is skipped, with why."""
    tally = Tally()
    source = await world.deployments.get(from_deployment)
    target = await world.deployments.get(to_deployment)
    for run_id in run_ids:
        try:
            run = await world.runs.get(run_id)
            if run.deployment_id != from_deployment or run.is_terminal:
                continue
            await _move(world, run, source, target, to_deployment, reason)
        except errors.RunNotMovable as exc:
            tally.skip(exc.reason)
            continue
        except errors.RunNotRepinned as exc:
            if exc.reason in ("unknown_target", "retired_target"):
                raise
            continue  # ended or moved meanwhile
        except errors.RunNotFound:
            continue
        tally.moved += 1
    return tally


async def _move(
    world: contract.World,
    run: records.RunRecord,
    source: records.DeploymentRecord | None,
    target: records.DeploymentRecord | None,
    to_deployment: str,
    reason: str | None,
) -> Moved:
    run_id = run.run_id
    if target is not None and not target.retired and not run.is_terminal:
        why = why_incompatible(run.workflow_name, source, target)
        if why is not None:
            raise errors.RunNotMovable(run_id, workflow=run.workflow_name, reason=why)
    moved = await world.runs.repin(
        run_id, from_deployment=run.deployment_id, to_deployment=to_deployment, reason=reason
    )
    log.warning(
        "run %s moved from deployment %s to %s%s",
        run_id,
        run.deployment_id,
        to_deployment,
        f" ({reason})" if reason else "",
    )
    await _wake(world, moved)
    return Moved(moved, run.deployment_id, to_deployment, "moved")


async def _wake(world: contract.World, run: records.RunRecord) -> None:
    """The recovery wake to the run's (new) deployment: replay, re-arm timers, re-send."""
    await world.queue.send(
        messages.OrchestratorMessage(
            run_id=run.run_id,
            deployment_id=run.deployment_id,
            run_spec_version=run.spec_version,
            recovery=True,
        )
    )
