"""A replay that diverged from its log, as both orchestrators handle it (seed 003 "Run
lifecycle": recovery replays in the same delivery, then ``CORRUPTED_EVENT_LOG``).

``over_budget`` logs the divergence (position, what the log and the code hold, which try
of how many) and says whether ``WORKFLOW_REPLAY_DIVERGENCE_MAX_RETRIES`` is spent;
``corrupted`` is the run's failure once it is. Used by ``orchestrator.delivery`` (spec 9)
and ``orchestrator.spec8.delivery``.
"""

from __future__ import annotations

import logging

from treadle import errors
from treadle.replay import engine
from treadle.world import events


def over_budget(
    log: logging.Logger, run_id: str, diverged: engine.Diverged, count: int, budget: int
) -> bool:
    """Log the ``count``-th divergence; True once it is past ``budget`` recoveries."""
    log.warning(
        "run %s: replay diverged at position %d (log: %s; code: %s), %d of %d",
        run_id,
        diverged.position,
        diverged.recorded,
        diverged.reached,
        count,
        budget + 1,
    )
    return count > budget


def corrupted(run_id: str, diverged: engine.Diverged) -> events.RunFailed:
    """The run's failure when replay keeps diverging."""
    error = errors.CorruptedEventLog(
        run_id, position=diverged.position, recorded=diverged.recorded, reached=diverged.reached
    )
    return events.RunFailed(
        error=events.ErrorInfo(
            message=str(error), type="CorruptedEventLog", code="CORRUPTED_EVENT_LOG"
        )
    )
