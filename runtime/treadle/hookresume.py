"""``resume_hook``'s two writes: the payload, then the wake (seed 003 "Hook edge cases").

``record_payload`` writes the out-of-band ``hook_received`` and says plainly
what a failure means: a hook that is no longer live (disposed, already resumed,
or its run ended between the token lookup and the write) is ``HookNotFound`` for
the token, never ``RunExpired``; a write that failed and committed nothing is
``HookPayloadNotRecorded``, which is safe to retry (audit Bug 10, HE2, HE3).

``wake`` sends the run's orchestrator wake once the payload is durable,
retrying a failed send after 25 ms and 100 ms. If every send fails it raises
``HookWakeFailed``: the payload IS recorded and the run sees it on its next
delivery, so the caller must not resume again (audit HE1, D2).

Called by ``treadle.client.Workflows.resume_hook``.
"""

from __future__ import annotations

import asyncio
import logging

from pydantic import JsonValue

from treadle import errors
from treadle.world import contract, events, messages, records

log = logging.getLogger("treadle.client")

# Delays before the second and third wake send (seed 003: 25 ms, then 100 ms).
WAKE_RETRY_DELAYS_SECONDS = (0.025, 0.1)


async def record_payload(
    world: contract.World, token: str, hook: records.HookRecord, payload: JsonValue
) -> records.EventResult:
    """The out-of-band ``hook_received`` for ``hook``; refusals as the caller can act on them."""
    received = events.HookReceived(correlation_id=hook.hook_id, payload=payload)
    try:
        return await world.events.create(hook.run_id, received, in_band=False)
    except (errors.HookNotFound, errors.RunExpired, errors.RunNotFound) as exc:
        # The hook went (resumed, disposed, or its run ended) after the lookup.
        raise errors.HookNotFound(token) from exc
    except (errors.StorageUnavailable, OSError) as exc:
        # The write's transaction failed: nothing was appended.
        raise errors.HookPayloadNotRecorded(token, run_id=hook.run_id, reason=str(exc)) from exc


async def wake(world: contract.World, token: str, run_id: str) -> None:
    """Wake the run whose hook took a payload: up to three sends, 25 ms and 100 ms apart."""
    last: BaseException | None = None
    attempts = 0
    for delay in (0.0, *WAKE_RETRY_DELAYS_SECONDS):
        if delay:
            await asyncio.sleep(delay)
        attempts += 1
        try:
            run = await world.runs.get(run_id)
            await world.queue.send(
                messages.OrchestratorMessage(
                    run_id=run.run_id,
                    deployment_id=run.deployment_id,
                    run_spec_version=run.spec_version,
                )
            )
            return
        except errors.RunNotFound:
            raise
        except Exception as exc:  # a queue or storage failure: retried, then reported
            last = exc
            log.warning(
                "run %s: wake after resume_hook(%r) failed (attempt %d): %s",
                run_id,
                token,
                attempts,
                exc,
            )
    assert last is not None
    raise errors.HookWakeFailed(
        token, run_id=run_id, attempts=attempts, reason=str(last) or type(last).__name__
    ) from last
