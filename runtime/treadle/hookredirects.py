"""``resume_hook`` and the hook features of issue 17 item 8 (seed 003 "Force-claim").

- **Follows a force-claim.** A resume that looked the token up in the victim's hook and
  then heard ``HookNotFound`` checks the victim's log: when the hook's disposal was a
  force-claim (``hook_disposed {force_claimed_by}``), it looks the token up again and
  writes to the new owner, up to ``MAX_FORCE_CLAIM_REDIRECTS`` (3) times.
- **A retained token.** A token that a run ended with and retains
  (``create_hook(..., retain_token_for=...)``) answers ``HookRunEnded`` (a
  ``HookNotFound``): the run ended, nothing is recorded, and nobody else can take the
  token and its late payloads until the retention passes.

Called by ``treadle.client.Workflows.resume_hook``.
"""

from __future__ import annotations

import logging
from typing import Final

from treadle import errors
from treadle.world import contract, events, records

log = logging.getLogger("treadle.client")

MAX_FORCE_CLAIM_REDIRECTS: Final = 3
_ENDED: Final = frozenset({"completed", "failed", "cancelled"})


async def check_live(world: contract.World, token: str, hook: records.HookRecord) -> None:
    """``HookRunEnded`` when ``hook`` is a retained token of a run that has ended."""
    if hook.retained_until is None:
        return
    run = await world.runs.get(hook.run_id)
    if run.status in _ENDED:
        raise errors.HookRunEnded(token, run_id=hook.run_id, status=run.status)


async def force_claimed_by(world: contract.World, hook: records.HookRecord) -> str | None:
    """The run that force-claimed ``hook``'s token, per the hook's own events (or None)."""
    page = await world.events.list_entity(hook.run_id, hook.hook_id)
    for logged in page.events:
        event = logged.event
        if isinstance(event, events.HookDisposed) and event.force_claimed_by is not None:
            return event.force_claimed_by
    return None
