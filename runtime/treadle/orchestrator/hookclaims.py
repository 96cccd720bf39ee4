"""The claimer's side of a hook force-claim: it wakes the victim (seed 003 "Force-claim").

The World has no queue: when it stores a ``hook_created`` as a force-claim (naming the
victim in ``claimed_from``) and writes ``hook_disposed {force_claimed_by}`` into the
victim's log, the claimer's orchestrator wakes the victim, whose await of the hook then
raises ``HookForceClaimedError``. ``wake_victim`` sends that wake (a spec 9 victim's
carries no key, a spec 8 one's is ``hook-force-claim-<hookId>``), retried after 25 and
100 ms; a wake that still fails raises, so the claimer's delivery fails and is delivered
again.

A claimer that died between the creation's commit and the wake repays it: every
delivery of the claimer that replays its log wakes the victims of the force-claims made
in the last ``FORCE_CLAIM_WAKE_REPUBLISH_WINDOW_SECONDS`` (24 hours), except those this
process woke already (``repay``). A victim that ended needs no wake; an extra wake costs
the victim one delivery that finds nothing new.

Called by ``orchestrator.delivery`` (``OrchestratorDelivery``).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Final

from treadle import clock, errors
from treadle.orchestrator.logstate import LogState
from treadle.orchestrator.runtime import Runtime
from treadle.world import constants, events

log = logging.getLogger("treadle.orchestrator.hooks")

FORCE_CLAIM_WAKE_REPUBLISH_WINDOW_SECONDS: Final = 24 * 3600
WAKE_RETRY_DELAYS_SECONDS: Final = (0.025, 0.1)
_ENDED: Final = frozenset({"completed", "failed", "cancelled"})
_REMEMBERED: Final = 10_000

# Per Runtime (one per worker process; the simulation runs several in one interpreter):
# the claimer hook ids whose victim this process woke.
_woken: dict[int, dict[str, None]] = {}


def _seen(rt: Runtime) -> dict[str, None]:
    held = _woken.get(id(rt))
    if held is None:
        held = _woken[id(rt)] = {}
        weakref.finalize(rt, _woken.pop, id(rt), None)
    return held


async def wake_victim(rt: Runtime, claimer_run_id: str, hook_id: str, victim_run_id: str) -> None:
    """Wake the run a force-claim took a token from (nothing when it has ended)."""
    last: BaseException | None = None
    for delay in (0.0, *WAKE_RETRY_DELAYS_SECONDS):
        if delay:
            await asyncio.sleep(delay)
        try:
            victim = await rt.world.runs.get(victim_run_id)
            if victim.status not in _ENDED:
                spec = victim.spec_version
                key = (
                    None
                    if spec >= constants.SPEC_VERSION_SINGLE_ORCHESTRATOR
                    else f"hook-force-claim-{hook_id}"
                )
                await rt.world.queue.send(
                    rt.wake_message(victim_run_id, victim.deployment_id, spec_version=spec),
                    key=key,
                )
            break
        except errors.RunNotFound:
            break  # nothing to wake
        except Exception as exc:  # a queue or storage failure: retried, then raised
            last = exc
            log.warning(
                "run %s: wake of force-claim victim %s failed: %s",
                claimer_run_id,
                victim_run_id,
                exc,
            )
    else:
        assert last is not None
        raise last
    seen = _seen(rt)
    seen[hook_id] = None
    while len(seen) > _REMEMBERED:
        del seen[next(iter(seen))]
    log.info(
        "run %s: woke run %s, whose hook token it force-claimed", claimer_run_id, victim_run_id
    )


def waker(rt: Runtime, run_id: str) -> Callable[[events.HookCreated], Awaitable[None]]:
    """``hookwrites.write_hooks``'s ``on_claimed`` for run ``run_id``: wake the victim."""

    async def on_claimed(created: events.HookCreated) -> None:
        assert created.claimed_from is not None
        await wake_victim(rt, run_id, created.correlation_id, created.claimed_from)

    return on_claimed


async def repay(rt: Runtime, run_id: str, state: LogState) -> None:
    """Wake the victims of the log's recent force-claims this process has not woken."""
    if not state.forced_claims:
        return
    since = clock.utcnow() - timedelta(seconds=FORCE_CLAIM_WAKE_REPUBLISH_WINDOW_SECONDS)
    seen = _seen(rt)
    for hook_id, (victim, at) in list(state.forced_claims.items()):
        if at >= since and hook_id not in seen:
            await wake_victim(rt, run_id, hook_id, victim)
