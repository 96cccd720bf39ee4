"""The gauges read from the World: open runs by status, dead letters, queue backlog.

``WorldGauges.refresh()`` reads them (one ``runs.count`` per open status, bounded; the
dead letters up to ``DEAD_LETTER_LIMIT``; this deployment's backlog per kind) at most
once per ``min_interval`` seconds, so scrapes from several Prometheus replicas cost one
read. Called by the worker's metrics endpoint and serve's route before each exposition;
a World that fails the read keeps the last values and logs a warning.
"""

from __future__ import annotations

import logging

from treadle import clock, metrics
from treadle.world import contract

log = logging.getLogger("treadle.metrics")

COUNT_LIMIT = 1_000_000
DEAD_LETTER_LIMIT = 1_000  # each is read whole (payload included): a bound, not a count


class WorldGauges:
    def __init__(
        self,
        world: contract.World,
        *,
        deployment_id: str | None = None,
        min_interval: float = 10.0,
    ) -> None:
        self.world = world
        self.deployment_id = deployment_id
        self.min_interval = min_interval
        self._last: float | None = None

    async def refresh(self) -> None:
        if not metrics.AVAILABLE:
            return
        now = clock.monotonic()
        if self._last is not None and now - self._last < self.min_interval:
            return
        self._last = now
        try:
            for status in metrics.OPEN_STATUSES:
                count = await self.world.runs.count(statuses=[status], limit=COUNT_LIMIT)
                metrics.OPEN_RUNS.labels(status).set(count)
            queue = self.world.queue
            if isinstance(queue, contract.DeadLetters):
                dead = await queue.dead_letters(limit=DEAD_LETTER_LIMIT)
                metrics.DEAD_LETTERS.set(len(dead))
            if self.deployment_id is not None:
                for kind in ("orchestrator", "step"):
                    backlog = await queue.backlog(kind, self.deployment_id)
                    metrics.BACKLOG.labels(kind).set(backlog)
        except Exception as exc:
            log.warning("metrics: reading the World's gauges failed (%s); kept the last", exc)
