"""The end-of-run hook drain (seed 003 "Terminal hook disposal").

When the workflow returns or raises, the run's terminal event releases every hook it
holds but a retained one, so the drain before it writes only what changes something:

- a disposal asked for a hook in the log is written when the hook has
  ``token_retention_until`` (it releases the retained token early), or when a later
  creation of this drain uses its token (so that creation does not conflict with this
  run's own hook); any other disposal is left to the terminal event;
- a hook created in the last pass is written when it retains its token (the token stays
  reserved after the run) or force-claims it (the victim still loses it, and is woken);
  any other is never created. One created and disposed in that pass without ``force``
  is not written at all.

A conflict in the drain is logged and left: the run is ending. Called by
``orchestrator.session.RunSession.write_terminal`` (before the ``run_completed`` or
``run_failed`` of a workflow that returned or raised).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from treadle.orchestrator import hookclaims, hookwrites
from treadle.replay import engine, operations

if TYPE_CHECKING:
    from treadle.orchestrator.session import RunSession

log = logging.getLogger("treadle.orchestrator.hooks")


def select(pending: engine.Suspended) -> engine.Suspended:
    """What of the last pass's hook decisions the terminal drain writes."""
    new = [
        op
        for op in pending.new
        if isinstance(op, operations.HookWait)
        and (op.force or (op.token_retention_until is not None and not op.dispose_requested))
    ]
    later = {op.token for op in new}
    dispose = [
        op for op in pending.dispose if op.token_retention_until is not None or op.token in later
    ]
    return engine.Suspended(new=list(new), dispose=dispose)


async def write(session: RunSession) -> None:
    """Write the drain's hook decisions (nothing when there are none)."""
    replay = session.replay
    if replay is None:
        return
    drain = select(replay.terminal_hooks())
    if not drain.new and not drain.dispose:
        return
    conflicts = await hookwrites.write_hooks(
        session, drain, on_claimed=hookclaims.waker(session.rt, session.run_id)
    )
    if conflicts:
        log.info("run %s: terminal drain: hook %s conflicts; left", session.run_id, conflicts[0])
