"""Writes made outside a delivery follow the run's own format (seed 003 "Writers outside
the orchestrator"): never ``WORKFLOW_SPEC_VERSION``, always the run's record.

- ``wake_up``: end a run's open sleeps now. On a spec 9 run the single orchestrator
  is the only writer of ``wait_completed``, so the request is recorded as one
  ``wake_requested`` and the wake asks the orchestrator to act on it. On a spec 8
  run (several writers, seed 003 "Spec 8 and spec 9 side by side") each asked
  wait is completed here, out-of-band (``wait_completed``; a
  ``WaitAlreadyCompleted`` refusal means another writer did it first, and is not
  counted), then one wake stamped 8 lets a delivery replay past them. Either way
  the wake carries the run's version.
- ``wake_message``: the plain wake of a run, stamped with its version and
  deployment (cancel, resume and wake-up send it).

Called by ``treadle.client`` (``Run.wake_up``) and the operator's ``WorkflowSignal`` Wake
(``treadle_operator.signalactions``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from treadle import errors
from treadle.world import contract, events, messages, records, specversions

log = logging.getLogger("treadle.client")


def wake_message(run: records.RunRecord) -> messages.OrchestratorMessage:
    """A wake for the run's orchestrator, stamped with the run's own version."""
    return messages.OrchestratorMessage(
        run_id=run.run_id, deployment_id=run.deployment_id, run_spec_version=run.spec_version
    )


def open_waits(logged: Iterable[events.LoggedEvent]) -> list[str]:
    """The waits the log created and did not complete, in creation order."""
    created: list[str] = []
    completed: set[str] = set()
    for record in logged:
        cid = record.correlation_id
        if cid is None:
            continue
        if record.type == "wait_created" and getattr(record.event, "position", None) != -1:
            created.append(cid)  # (position -1 is the run timeout: no wake-up ends it)
        elif record.type == "wait_completed":
            completed.add(cid)
    return [cid for cid in created if cid not in completed]


async def wake_up(
    world: contract.World,
    run: records.RunRecord,
    logged: Iterable[events.LoggedEvent],
    waits: list[str] | None = None,
) -> int:
    """End the run's open sleeps (all, or those named in ``waits``); how many were asked
    (spec 9) or completed by this call (spec 8). 0 and nothing sent on an ended run."""
    if run.is_terminal:
        return 0
    still_open = open_waits(logged)
    asked = still_open if waits is None else [cid for cid in still_open if cid in set(waits)]
    if completes_waits_itself(run):
        return await complete_waits(world, run, asked)
    try:
        await world.events.create(run.run_id, events.WakeRequested(waits=waits), in_band=False)
    except errors.RunExpired:
        log.info("run %s: ended before its wake_up was recorded", run.run_id)
        return 0
    await world.queue.send(wake_message(run))
    return len(asked)


def completes_waits_itself(run: records.RunRecord) -> bool:
    """A wake-up of this run completes its waits itself (spec 8) rather than recording a
    ``wake_requested`` (spec 9, which a spec 8 run never receives)."""
    return specversions.orchestrator_for(run.spec_version) is specversions.Family.SPEC8


async def complete_waits(world: contract.World, run: records.RunRecord, asked: list[str]) -> int:
    """A spec 8 run's wake-up: ``wait_completed`` out-of-band for each of ``asked`` (a
    ``WaitAlreadyCompleted`` refusal is another writer's completion, not counted), then
    one wake stamped with the run's version; how many this call completed."""
    completed = 0
    for cid in asked:
        try:
            await world.events.create(
                run.run_id, events.WaitCompleted(correlation_id=cid), in_band=False
            )
        except errors.WaitAlreadyCompleted:
            continue  # another writer completed it first (a timer's delivery, say)
        except errors.RunExpired:
            log.info("run %s: ended during its wake_up (%d completed)", run.run_id, completed)
            return completed
        completed += 1
    await world.queue.send(wake_message(run))
    return completed
