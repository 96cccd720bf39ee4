"""Which hook a webhook URL names, and why it is refused when none is live (issue 13).

The World keys live hooks by token and forgets a token once its hook took a payload,
was disposed, or its run ended: ``hooks.get_by_token`` answers ``HookNotFound`` alike
for all of those and for a token that never existed. A webhook URL carries its run
id (``/hooks/<run id>.<token>``, ``treadle.webhookspec``) so the run's log can tell
them apart: ``hook_created`` with the token and then ``hook_received`` for it is
"already received" (``WebhookAlreadyReceived``, 409); anything else (no such run, no
such hook in it, disposed, the run ended) is ``HookNotFound`` (404). Reading the log
costs a listing only on the refusal path: a live hook is one ``get_by_token``.

The log also finds a live hook whose token was stored under another
``TREADLE_HOOK_TOKEN_NAMESPACE`` than serve's (the recorded token is looked up), so
one serve can take the webhooks of several namespaced deployments.

Called by ``treadle.serve.webhooks``.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from typing import Literal

from treadle import errors, hooktokens
from treadle.world import contract, events, records

log = logging.getLogger("treadle.serve.webhooks")

State = Literal["live", "received", "gone", "unknown"]


@dataclass(frozen=True, slots=True)
class LogState:
    """What the run's log says of the hook with a token."""

    state: State
    stored_token: str | None = None


async def find_live(
    world: contract.World, run_id: str, token: str, namespace: str | None
) -> records.HookRecord:
    """The live hook of ``run_id`` holding ``token`` (bare), else the refusal that says
    why: ``WebhookAlreadyReceived`` or ``HookNotFound``."""
    hook = await _get(world, hooktokens.stored(token, namespace), run_id)
    if hook is not None:
        return hook
    found = await state_in_log(world, run_id, token)
    if found.state == "live" and found.stored_token is not None:
        hook = await _get(world, found.stored_token, run_id)
        if hook is not None:
            return hook
        found = await state_in_log(world, run_id, token)  # it went meanwhile: say how
    raise refusal(found, token, run_id)


def refusal(found: LogState, token: str, run_id: str) -> errors.HookNotFound:
    if found.state == "received":
        return errors.WebhookAlreadyReceived(token, run_id=run_id)
    return errors.HookNotFound(token, run_id=run_id)


async def _get(world: contract.World, stored: str, run_id: str) -> records.HookRecord | None:
    try:
        hook = await world.hooks.get_by_token(stored)
    except errors.HookNotFound:
        return None
    # A token is unique World-wide; a live hook of another run is not this URL's.
    return hook if hook.run_id == run_id else None


async def state_in_log(world: contract.World, run_id: str, token: str) -> LogState:
    """Read ``run_id``'s log for the hook whose (bare) token is ``token``."""
    created: dict[str, str] = {}  # correlation id -> stored token
    received: set[str] = set()
    ended: set[str] = set()
    terminal = False
    after = 0
    want = token.encode()
    try:
        while True:
            page = await world.events.list(run_id, after_slot=after)
            for logged in page.events:
                event = logged.event
                cid = logged.correlation_id
                if isinstance(event, events.HookCreated) and cid is not None:
                    # Constant-time: the caller chose ``token``; the log's are secrets.
                    if hmac.compare_digest(hooktokens.bare(event.token).encode(), want):
                        created[cid] = event.token
                elif isinstance(event, events.HookReceived) and cid is not None:
                    received.add(cid)
                elif isinstance(event, events.HookDisposed) and cid is not None:
                    ended.add(cid)
                elif logged.type in events.RUN_TERMINAL_TYPES:
                    terminal = True
            if not page.has_more:
                break
            after = page.cursor
    except errors.RunNotFound:
        return LogState("unknown")
    if not created:
        return LogState("unknown")
    # Minted tokens are not reused, so one creation; take the latest if there were more.
    cid, stored = list(created.items())[-1]
    if cid in received:
        return LogState("received", stored)
    if cid in ended or terminal:
        return LogState("gone", stored)
    return LogState("live", stored)
