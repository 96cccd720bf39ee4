"""treadle's traces, log format and the switches that turn metrics on (issue 13).

- ``configure()`` (``treadle worker``, ``run``, ``start``, ``serve``): JSON logs when
  ``TREADLE_LOG_FORMAT=json``, span export from ``OTEL_EXPORTER_OTLP_*`` (``setup``).
- ``instrument(world)`` (``Workflows.world()``): the World wrapper that makes the spans,
  stamps trace context on messages and records metrics (``worldwrap``), when any of
  tracing, metrics or JSON logs is on (``active()``).
- ``add_to_current(name, value)``: add to a counter attribute of the current delivery's
  ``workflow.execute`` span (seed 000's ``workflow.inline_ownership.*``, which the spec 8
  delivery reports); ``set_on_current(name, value)`` sets one.
- ``hooks.step_attempt`` / ``hooks.run_start``: the two decorators on
  ``orchestrator.steps.execute`` and ``client.start_run``.

Library code uses ``opentelemetry-api`` only, and nothing at all when it is missing.
See docs/observability.md for the span tree, attributes and metrics.
"""

from __future__ import annotations

from treadle import metrics
from treadle.telemetry import logs, names, tracing, worldwrap
from treadle.telemetry.setup import configure
from treadle.telemetry.tracing import add_to_current, set_on_current, use_provider
from treadle.world import contract

__all__ = [
    "active",
    "add_to_current",
    "configure",
    "describe_run",
    "instrument",
    "names",
    "reenqueued",
    "set_on_current",
    "use_provider",
]


def describe_run(workflow_name: str, spec_version: int) -> None:
    """Name the run on the current delivery's span, once the delivery knows it."""
    set_on_current(names.WORKFLOW_NAME, workflow_name)
    set_on_current(names.SPEC_VERSION, spec_version)


def reenqueued(count: int, *, recovery: bool) -> None:
    """Seed 003's re-send pass attributes on ``workflow.execute``."""
    add_to_current(names.REENQUEUE_COUNT, count)
    if recovery:
        set_on_current(names.REENQUEUE_RECOVERY, True)


def active() -> bool:
    """Tracing, metrics or JSON logs are on: the World wrapper earns its keep."""
    return tracing.enabled() or metrics.enabled() or logs.json_enabled()


def instrument(world: contract.World) -> contract.World:
    """``world`` with its queue, events and runs traced (in place), when ``active()``."""
    if not active():
        return world
    return worldwrap.instrument(world)
