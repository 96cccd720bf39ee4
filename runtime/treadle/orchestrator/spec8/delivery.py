"""One orchestrator delivery of a spec 8 run (seed 000, seed 003 "Spec 8 and spec 9
side by side"). Built on branch c8; this is the interface the worker routes to.
"""

from __future__ import annotations

import logging

from treadle.orchestrator.runtime import Runtime
from treadle.world import constants, messages

log = logging.getLogger("treadle.orchestrator.spec8")


async def deliver(
    rt: Runtime, message: messages.OrchestratorMessage, meta: messages.DeliveryMeta
) -> messages.HandlerResult:
    """Drive a spec 8 run for one delivery of ``message``."""
    log.error("run %s: the spec 8 orchestrator is not built in this tree", message.run_id)
    return messages.Redeliver(constants.MAX_REDELIVER_SECONDS)
