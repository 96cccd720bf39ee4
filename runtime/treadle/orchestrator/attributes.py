"""The orchestrator's side of run attributes (issue 17 item 2, docs/attributes.md).

Workflow code: ``set_attributes()`` leaves ``attr_set`` decisions in the replay's
``pending_attributes``. ``write_pending`` (called by ``RunAhead.before_acting`` right
after each ``advance``, before the pass acts on a suspension or writes the run's end)
drains run-ahead and writes them in-band, awaited, one event per key at its position;
the pass then runs again. A boundary carrying an ``attr_set`` is therefore never
speculative: run-ahead has nothing in flight when it is written, and an ``attr_set`` of
another writer below a speculative write is no hazard (attributes are write-only inside
a workflow: nothing the workflow decides depends on them).

Step code: ``bind_step`` gives a step attempt its own out-of-band writer
(``sdk.attributes.STEP_WRITER``). Under turbo's optimistic start (seed 003 "Every write
still lands after ``run_started``") the write first waits on the delivery's run-ready
barrier (``RUN_READY``, set by ``OptimisticStarts.deciding`` for the delivery and the
bodies it starts); a ``run_started`` that failed fails the write, so a refused start
leaves no attribute on a run whose log does not record the step that set it.

Used by ``orchestrator.runahead``, ``orchestrator.steps`` and ``orchestrator.turbo``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from pydantic import JsonValue

from treadle import errors
from treadle.orchestrator.writer import LeaseLost
from treadle.replay import engine
from treadle.sdk import attributes as sdk_attributes
from treadle.world import contract, events, messages

if TYPE_CHECKING:
    from treadle.orchestrator.session import RunSession

log = logging.getLogger("treadle.orchestrator.attributes")

StepToken = contextvars.Token[sdk_attributes.StepAttributes | None]
# Tries of a step's attr_set on a storage error (as its outcome's, ``steps``).
WRITE_ATTEMPTS = 3
WRITE_RETRY_SECONDS = 0.1

# The current delivery's run-ready barrier (``OptimisticStarts.run_ready``): inline
# bodies it starts inherit it; a background step's delivery has none.
RUN_READY: contextvars.ContextVar[Callable[[], Awaitable[None]] | None] = contextvars.ContextVar(
    "treadle_run_ready", default=None
)


async def write_pending(
    session: RunSession, drain: Callable[[], Awaitable[bool]], outcome: engine.Outcome
) -> bool:
    """Write the pass's new workflow ``attr_set`` events in-band; True when the caller
    must run the pass again (written, or run-ahead replayed while draining)."""
    if not isinstance(outcome, engine.Suspended | engine.Completed | engine.Failed):
        return False  # diverged or ended: nothing of this pass is written
    replay = session.replay
    if replay is None or not replay.pending_attributes:
        return False
    if await drain():
        return True  # run-ahead repaired or replayed: decide again on the new replay
    pending = sorted(replay.pending_attributes.values(), key=lambda op: op.position)
    for op in pending:
        if op.recorded:
            continue
        await session.write(
            events.AttrSet(
                correlation_id=op.correlation_id,
                key=op.key,
                value=op.value,
                position=op.position,
            )
        )
    log.debug("run %s: wrote %d attribute(s) in-band", session.run_id, len(pending))
    return True


def bind_step(
    world: contract.World, run_id: str, lease: messages.DeliveryMeta | None = None
) -> StepToken:
    """Give the current step attempt its out-of-band attribute writer; returns the token
    ``unbind_step`` takes. ``lease``: the orchestrator delivery running the body inline;
    once its lease lapsed the body's writes stop (``LeaseLost``, nothing written), as
    every write of that delivery does."""
    barrier = RUN_READY.get()

    async def write(values: dict[str, JsonValue]) -> None:
        if barrier is not None:
            await barrier()  # raises run_started's failure: nothing is written then
        for key, value in values.items():
            if lease is not None and lease.lost_lease():
                raise LeaseLost(f"run {run_id}: the delivery lost its lease; {key!r} unwritten")
            event = events.AttrSet(key=key, value=value)
            for attempt in range(1, WRITE_ATTEMPTS + 1):
                try:
                    await world.events.create(run_id, event, in_band=False)
                    break
                except errors.StorageUnavailable as exc:
                    # Written again on an unknown outcome: a second equal attr_set folds
                    # to the same attributes.
                    if attempt == WRITE_ATTEMPTS:
                        raise
                    log.info("run %s: attribute %r not written (%s); again", run_id, key, exc)
                    await asyncio.sleep(WRITE_RETRY_SECONDS * 2 ** (attempt - 1))

    state = sdk_attributes.StepAttributes(write, asyncio.get_running_loop())
    return sdk_attributes.STEP_WRITER.set(state)


async def settle_step() -> None:
    """Wait for the attempt's attribute writes (before its outcome is written)."""
    state = sdk_attributes.STEP_WRITER.get()
    if state is not None:
        await state.settle()


def unbind_step(token: StepToken) -> None:
    sdk_attributes.STEP_WRITER.reset(token)
