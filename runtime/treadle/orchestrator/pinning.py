"""Deployment pinning: a run is only ever replayed by the deployment it is pinned to.

That is the deployment that started it, until ``runs.repin`` moves it
(``treadle.moves``): the log's last ``run_repinned`` names the new one, and the
orchestrator's log state follows it. A delivery that reaches another deployment
(by its stamp, or by the run row or log the delivery loaded) is not replayed: it
is re-sent to the run's deployment after 1, 2, then 4 s, and after three
re-routes, or at once when that deployment is unknown or retired, the run fails
with ``DeploymentMismatch`` (seed 004, "Pinning runs to a deployment").
"""

from __future__ import annotations

import contextlib
import logging

from treadle import errors
from treadle.orchestrator.runtime import Runtime
from treadle.world import events, messages

log = logging.getLogger("treadle.orchestrator.pinning")

MAX_REROUTES = 3


async def reroute(
    rt: Runtime,
    message: messages.OrchestratorMessage,
    pinned: str,
    *,
    run_spec_version: int | None = None,
) -> messages.HandlerResult:
    """A delivery for another deployment's run is not replayed here.

    It is re-sent to that deployment after 1, 2, 4 s; after three re-routes, or at
    once when that deployment is unknown or retired, the run fails. An unstamped message
    is re-sent stamped with ``run_spec_version`` (the run's, when the caller read it:
    seed 003 "Stamps at every send site").
    """
    gone = False
    deployments = getattr(rt.world, "deployments", None)
    if deployments is not None:
        record = await deployments.get(pinned)
        gone = record is None or record.retired
    if not gone and message.reroute_count < MAX_REROUTES:
        delay = 2.0**message.reroute_count
        log.warning(
            "run %s: message for deployment %s reached %s; re-sending in %.0f s",
            message.run_id,
            pinned,
            rt.deployment_id,
            delay,
        )
        update: dict[str, object] = {
            "reroute_count": message.reroute_count + 1,
            "deployment_id": pinned,
        }
        if message.spec_version is None and run_spec_version is not None:
            update["run_spec_version"] = run_spec_version  # the copy names the run's version
        copy = message.model_copy(update=update)
        await rt.world.queue.send(copy, delay_seconds=delay)
        return messages.ACK
    why = (
        "is gone (unknown or retired)"
        if gone
        else (f"did not take its deliveries after {MAX_REROUTES} re-routes")
    )
    error = events.ErrorInfo(
        message=f"run {message.run_id} is pinned to deployment {pinned}, which {why}",
        type="DeploymentMismatch",
        code="DEPLOYMENT_MISMATCH",
    )
    with contextlib.suppress(errors.RunExpired, errors.RunNotFound):
        await rt.world.events.create(message.run_id, events.RunFailed(error=error), in_band=False)
    return messages.ACK
