"""A suspension's hook writes, and what a hook conflict does to the delivery.

Seed 003 "Hook conflicts" and "Terminal hook disposal"; audit Bug 5, Bug 6, D3.

``write_hooks`` writes a suspension's hook decisions through the in-band writer,
before any step or wait of the same suspension: first the disposals of hooks
already in the log, then each new hook's ``hook_created`` in position order,
followed at once by its ``hook_disposed`` when the workflow disposed it in the
same pass. So creating, disposing and re-creating one token in one pass never
conflicts with the run's own hook.

A new hook the World answers with ``hook_conflict`` stops the writes there and
is returned: the pass that made the rest of the suspension's decisions read
``HookHandle.conflict()`` before the conflict existed, so its decisions are
stale. Nothing else of that suspension is written, so no inline step starts
while a conflict is unseen. ``ConflictContinuations`` then gives each
conflicting hook one in-place continuation (a fresh replay of the log, in which
``conflict()`` answers at creation, as on every later replay), and past that a
handoff, so a delivery never loops on conflicts.

Called by ``orchestrator.delivery`` (``OrchestratorDelivery._create``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from treadle.replay import engine, operations
from treadle.world import events

log = logging.getLogger("treadle.orchestrator.hooks")


class HookWriter(Protocol):
    """What writes a suspension's hooks: a spec 9 ``RunSession`` (in-band) or a spec 8
    delivery's ``Spec8Writes`` (out-of-band)."""

    @property
    def run_id(self) -> str: ...

    async def write(self, event: events.Event) -> events.LoggedEvent: ...


async def write_hooks(
    session: HookWriter,
    suspended: engine.Suspended,
    *,
    on_claimed: Callable[[events.HookCreated], Awaitable[None]] | None = None,
) -> list[str]:
    """Write the suspension's hook disposals and creations; the ids of new hooks that
    came back as ``hook_conflict`` (the writes stop at the first one). A creation the
    World stored as a force-claim (``claimed_from``) is handed to ``on_claimed`` (the
    victim's wake, ``orchestrator.hookclaims``) before the next write."""
    on_claimed = on_claimed or getattr(session, "claimed", None)
    for hook in suspended.dispose:
        await session.write(events.HookDisposed(correlation_id=hook.correlation_id))
        hook.disposed = True
    new = [op for op in suspended.new if isinstance(op, operations.HookWait)]
    for op in sorted(new, key=lambda o: o.position):
        logged = await session.write(
            events.HookCreated(
                correlation_id=op.correlation_id,
                token=op.token,
                metadata=op.metadata,
                position=op.position,
                force=op.force,
                token_retention_until=op.token_retention_until,
            )
        )
        created = logged.event
        if isinstance(created, events.HookCreated) and created.claimed_from and on_claimed:
            await on_claimed(created)
        if isinstance(logged.event, events.HookConflict):
            log.info(
                "run %s: hook %r at position %d conflicts with run %s",
                session.run_id,
                op.token,
                op.position,
                logged.event.holder_run_id,
            )
            return [op.correlation_id]
        if op.dispose_requested:
            # Disposed in the pass that created it: free the token before any later
            # creation of this pass can ask for it.
            await session.write(events.HookDisposed(correlation_id=op.correlation_id))
            op.disposed = True
    return []


class ConflictContinuations:
    """One in-place continuation per conflicting hook id per delivery, then handoff."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.continued: set[str] = set()

    def may_continue(self, hook_ids: Iterable[str]) -> bool:
        """True (and counted) when none of ``hook_ids`` was continued in this delivery."""
        ids = set(hook_ids)
        if ids & self.continued:
            log.info(
                "run %s: hook conflict of %s already continued once; handing off",
                self.run_id,
                sorted(ids & self.continued),
            )
            return False
        self.continued |= ids
        return True
