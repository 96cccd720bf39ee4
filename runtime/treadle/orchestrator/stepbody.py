"""Running one attempt of a step body, inline or background, and what it came to.

``execute`` runs the body (its timeouts, heartbeats, attribute writes and stream
writers bound to the attempt) and turns what happened into an ``Outcome``:
completed, retry (with its delay) or failed; ``outcome_event`` is the event that
records it. ``treadle.orchestrator.steps`` handles a background step's message
around it; inline steps run it from the orchestrator's delivery.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import JsonValue

from treadle import clock, errors, limits, serde
from treadle.orchestrator import attributes as attribute_writes
from treadle.orchestrator import steptimeouts, streamflush
from treadle.orchestrator.runtime import Runtime
from treadle.sdk import context, functions
from treadle.telemetry import hooks as telemetry_hooks
from treadle.world import events, messages

log = logging.getLogger("treadle.orchestrator.steps")


@dataclass(frozen=True)
class Outcome:
    kind: str  # "completed", "retry", "failed"
    result: JsonValue = None
    error: events.ErrorInfo | None = None
    retry_after_seconds: float = 0.0


def error_info(exc: BaseException) -> events.ErrorInfo:
    """What the log records of an exception; text every World can store (``limits.storable``)."""
    stack = "".join(traceback.format_exception(exc))[-8000:]
    code = getattr(exc, "code", None)
    return events.ErrorInfo(
        message=limits.storable(str(exc) or type(exc).__name__),
        type=limits.storable(type(exc).__name__),
        code=limits.storable(code) if isinstance(code, str) else None,
        stack=limits.storable(stack),
    )


@telemetry_hooks.step_attempt
async def execute(
    rt: Runtime,
    *,
    run_id: str,
    workflow_name: str,
    step_id: str,
    step_name: str,
    input: JsonValue,
    attempt: int,
    max_retries: int,
    started_at: datetime,
    lease: messages.DeliveryMeta | None = None,
) -> Outcome:
    """Run one attempt of a step body and say what it came to. ``lease``: the orchestrator
    delivery running it inline (its body's own writes stop once that lease lapsed)."""
    fn = rt.steps.get(step_name)
    if fn is None:
        return Outcome(
            "failed",
            error=events.ErrorInfo(
                message=f"no step named {step_name!r} is registered in this worker",
                type="StepNotRegistered",
            ),
        )
    meta = context.StepMetadata(run_id, step_id, step_name, attempt, started_at, workflow_name)
    token = context.STEP.set(meta)
    attrs = attribute_writes.bind_step(rt.world, run_id, lease)  # set_attributes() in the body
    stream_scope = streamflush.open_scope(rt, meta)  # the attempt's stream writers
    try:
        args, kwargs = functions.decode_arguments(input, f"step {step_name} input")
        if steptimeouts.has_timeouts(fn):  # its timeout and heartbeats (docs/timeouts.md)
            value: Any = await steptimeouts.run_body(rt, fn, args, kwargs, meta)
        else:
            value = await fn.run_body(args, kwargs)
        await attribute_writes.settle_step()  # its attr_sets land before its outcome
        return Outcome("completed", result=serde.encode(value, f"step {step_name} result"))
    except errors.FatalError as exc:
        return Outcome("failed", error=error_info(exc))
    except errors.SerializationError as exc:
        return Outcome("failed", error=error_info(exc))
    except Exception as exc:
        if attempt > max_retries:
            return Outcome("failed", error=error_info(exc))
        delay = rt.settings.WORKFLOW_STEP_RETRY_DELAY_SECONDS
        if isinstance(exc, errors.RetryableError) and exc.retry_after is not None:
            delay = exc.retry_after
        log.info(
            "run %s: step %s attempt %d failed (%s); retrying in %.1f s",
            run_id,
            step_name,
            attempt,
            exc,
            delay,
        )
        return Outcome("retry", error=error_info(exc), retry_after_seconds=delay)
    finally:
        attribute_writes.unbind_step(attrs)
        context.STEP.reset(token)
        await streamflush.close_scope(*stream_scope)  # chunks on their way: wait or defer


def outcome_event(step_id: str, step_name: str, attempt: int, outcome: Outcome) -> events.Event:
    if outcome.kind == "completed":
        return events.StepCompleted(
            correlation_id=step_id, step_name=step_name, result=outcome.result, attempt=attempt
        )
    assert outcome.error is not None
    if outcome.kind == "retry":
        return events.StepRetrying(
            correlation_id=step_id,
            step_name=step_name,
            attempt=attempt,
            error=outcome.error,
            retry_after=clock.utcnow() + timedelta(seconds=outcome.retry_after_seconds),
        )
    return events.StepFailed(
        correlation_id=step_id, step_name=step_name, attempt=attempt, error=outcome.error
    )
