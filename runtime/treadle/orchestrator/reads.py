"""The orchestrator's read deadline (seed 003 ``WORKFLOW_ORCHESTRATOR_READ_TIMEOUT_MS``).

The orchestrator is its run's only reader, and it holds the run while it
reads: a tail read that never returns would hold the run for ever with the
events it waits for already committed. ``bounded`` gives one read a deadline,
sends it again on expiry with twice the deadline, and after the last attempt
raises ``ReadTimedOut``, so the delivery fails and the queue redelivers the
run. A live-feed poll takes one attempt (a held poll must not stop later
ones). Full loads are not bounded by it (a large log takes its time); the
Postgres World bounds every statement itself.

Called by ``orchestrator.session`` (tail reads, polls) and ``orchestrator.worker``
(the no-op wake's one-event read).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from treadle import errors

log = logging.getLogger("treadle.orchestrator.reads")

T = TypeVar("T")

# Attempts of a tail read before the delivery gives up (seed 003: three).
READ_ATTEMPTS = 3


async def bounded(
    read: Callable[[], Awaitable[T]],
    *,
    timeout_ms: int,
    run_id: str,
    what: str,
    attempts: int = READ_ATTEMPTS,
) -> T:
    """``await read()`` under the deadline; each retry waits twice as long as the one before.

    ``timeout_ms`` 0 turns the deadline off. Raises ``ReadTimedOut`` when every
    attempt timed out (the read in flight is cancelled each time).
    """
    if timeout_ms <= 0:
        return await read()
    waited = 0
    deadline = timeout_ms
    for attempt in range(1, attempts + 1):
        try:
            async with asyncio.timeout(deadline / 1000):
                return await read()
        except TimeoutError:
            waited += deadline
            log.warning(
                "run %s: %s did not answer in %d ms (attempt %d of %d)",
                run_id,
                what,
                deadline,
                attempt,
                attempts,
            )
            deadline *= 2
    raise errors.ReadTimedOut(run_id, what=what, attempts=attempts, waited_ms=waited)
