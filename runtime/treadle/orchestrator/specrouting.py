"""Which orchestrator drives a delivery, and the hand-off of a wrongly hinted message
(seed 003 "Resolving a delivery's spec", "Routing edge cases").

- ``stamped``: the version a message names, in the seed's order: ``run_input``,
  then ``run_context`` (a step message), then the ``run_spec_version`` hint; None
  for an unstamped message.
- ``resolve``: ``stamped``, else the run row (read once; a run without a row
  takes this worker's minted version, and that orchestrator handles the missing
  run). Nothing is remembered between messages.
- ``hand_off``: a delivery whose loaded run is of the other family sends the
  message again stamped with the run's own version, before it replays anything,
  and acknowledges.

Called by the worker (routing) and by both orchestrators' deliveries (hand-off).
"""

from __future__ import annotations

import logging

from treadle import errors
from treadle.orchestrator.runtime import Runtime
from treadle.world import messages, specversions

log = logging.getLogger("treadle.orchestrator.routing")


def stamped(message: messages.OrchestratorMessage | messages.StepMessage) -> int | None:
    """The version the message itself names (steps 1 to 3 of the seed's order)."""
    return message.spec_version


async def resolve(rt: Runtime, message: messages.OrchestratorMessage | messages.StepMessage) -> int:
    """The spec version that routes this delivery (step 4: one run read if unstamped)."""
    version = stamped(message)
    if version is not None:
        return version
    try:
        run = await rt.world.runs.get(message.run_id)
    except errors.RunNotFound:
        return minted(rt)
    return run.spec_version


def minted(rt: Runtime) -> int:
    """The version this worker would mint for a new run: the family that handles a message
    naming no run (seed 003 "Routing edge cases")."""
    requested = rt.settings.WORKFLOW_SPEC_VERSION
    return specversions.mint(requested, in_band_fence=rt.world.capabilities.in_band_fence).version


def hands_off(run_spec_version: int, here: specversions.Family) -> bool:
    """True when a delivery in the ``here`` orchestrator loaded a run of the other family:
    a format this build drives (``SUPPORTED``) that is not ``here``'s. A version it does
    not know at all is left for a worker that has it, never handed off."""
    if run_spec_version not in specversions.SUPPORTED:
        return False
    return specversions.orchestrator_for(run_spec_version) is not here


async def hand_off(
    rt: Runtime, message: messages.OrchestratorMessage, run_spec_version: int
) -> messages.HandlerResult:
    """Send ``message`` again with the run's own version (it reached the other family's
    orchestrator by a wrong or missing hint) and acknowledge this delivery."""
    fixed = message.model_copy(update={"run_spec_version": run_spec_version, "run_input": None})
    log.warning(
        "run %s: a message hinted spec %s but the run is spec %s (%s orchestrator); sent "
        "again with the run's version",
        message.run_id,
        message.spec_version,
        run_spec_version,
        specversions.orchestrator_for(run_spec_version).name.lower(),
    )
    await rt.world.queue.send(fixed)
    return messages.ACK
