"""The decorators the orchestrator and the client put on their one function each.

- ``step_attempt`` on ``orchestrator.steps.execute`` (one attempt of a step body, inline
  or background): a ``step.execute`` span (``step.name``, ``step.id``, ``step.attempt``,
  ``step.outcome``), the attempt's metrics (by step name, when the app's registry has
  the step: ``metrics.UNREGISTERED`` otherwise, so a forged message cannot grow a label
  set), and the step its log lines name.
- ``run_start`` on ``client.start_run``: a ``workflow.start`` span around the run's
  creation and its start message, whose context becomes the run's trace (``tracing``).

And ``instrument(world)``, which ``Workflows.world()`` calls on the World it opens.
The decorators call straight through when telemetry is off (``active()``).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from treadle import clock, metrics
from treadle.telemetry import names, scope, tracing
from treadle.world import contract

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def active() -> bool:
    from treadle import telemetry

    return telemetry.active()


def instrument(world: contract.World) -> contract.World:
    """``telemetry.instrument``: the World wrapper, when telemetry is on."""
    from treadle import telemetry

    return telemetry.instrument(world)


def step_attempt(fn: F) -> F:
    @functools.wraps(fn)
    async def wrapper(rt: Any, /, **kw: Any) -> Any:
        if not active():
            return await fn(rt, **kw)
        step_name = str(kw.get("step_name"))
        attrs: dict[str, tracing.AttributeValue | None] = {
            names.RUN_ID: kw.get("run_id"),
            names.WORKFLOW_NAME: kw.get("workflow_name"),
            names.STEP_ID: kw.get("step_id"),
            names.STEP_NAME: step_name,
            names.STEP_ATTEMPT: kw.get("attempt"),
        }
        registered = step_name in getattr(rt, "steps", {})
        token = scope.STEP.set(step_name)
        began = clock.monotonic()
        try:
            with tracing.span(names.STEP_EXECUTE, attrs) as current:
                outcome = await fn(rt, **kw)
                kind = str(getattr(outcome, "kind", "unknown"))
                if current is not None:
                    current.set_attribute(names.STEP_OUTCOME, kind)
        finally:
            scope.STEP.reset(token)
        label = step_name if registered else metrics.UNREGISTERED
        metrics.step_attempt(label, kind, clock.monotonic() - began)
        return outcome

    return cast(F, wrapper)


def run_start(fn: F) -> F:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kw: Any) -> Any:
        if not tracing.enabled():
            return await fn(*args, **kw)
        run_id = kw.get("run_id")
        attrs: dict[str, tracing.AttributeValue | None] = {
            names.RUN_ID: run_id,
            names.WORKFLOW_NAME: kw.get("name"),
            names.SPEC_VERSION: kw.get("spec_version"),
            names.DEPLOYMENT_ID: kw.get("deployment_id"),
        }
        with tracing.span(names.WORKFLOW_START, attrs) as current:
            if current is not None and isinstance(run_id, str):
                carrier = tracing.format_traceparent(current.get_span_context())
                if carrier is not None:
                    tracing.remember(run_id, carrier)
            return await fn(*args, **kw)

    return cast(F, wrapper)
