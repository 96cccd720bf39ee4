"""In-process single-flight for inline step bodies of spec 8 runs (seed 000).

The lease bounds duplicates across processes only where a platform kills
invocations; in one process (the local World, a long-lived worker) a backstop
wake or an owner redelivery can arrive while the owning body still runs here.
``SingleFlight`` keys bodies by ``run_id:correlation_id``: the first claimant
runs the body; a later claimant (the loser) awaits the winner's settlement and
then acknowledges its message without executing. The loser never acks early:
a crash after an early ack would leave the step with no message to drive it.

Called by the spec 8 delivery around every inline body it executes (first
runs and owned recoveries alike).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

log = logging.getLogger("treadle.orchestrator.spec8")


@dataclass(frozen=True)
class Claim:
    """What a claimant got: ``won`` runs the body; a loser was absorbed."""

    won: bool


class SingleFlight:
    """One running body per ``run_id:correlation_id`` in this process."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Event] = {}
        self.absorbed = 0

    @staticmethod
    def key(run_id: str, correlation_id: str) -> str:
        return f"{run_id}:{correlation_id}"

    def running(self, run_id: str, correlation_id: str) -> bool:
        return self.key(run_id, correlation_id) in self._running

    @asynccontextmanager
    async def claim(self, run_id: str, correlation_id: str) -> AsyncIterator[Claim]:
        """Run the body inside when ``claim.won``; a loser's block runs after the winner settled."""
        key = self.key(run_id, correlation_id)
        settled = self._running.get(key)
        if settled is not None:
            self.absorbed += 1
            log.warning(
                "run %s: step %s is already running in this process; waiting for it to "
                "settle instead of running it twice (many of these mean leases expire "
                "under live bodies: raise WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS)",
                run_id,
                correlation_id,
            )
            await settled.wait()
            yield Claim(won=False)
            return
        done = asyncio.Event()
        self._running[key] = done
        try:
            yield Claim(won=True)
        finally:
            del self._running[key]
            done.set()
