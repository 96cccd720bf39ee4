"""treadle's Prometheus metrics: what workers and ``treadle serve`` expose at ``/metrics``.

Recorded by ``treadle.telemetry`` (the World wrapper and the step-attempt hook) into one
registry of treadle's own (``REGISTRY``), never the process-wide default one; rendered
by ``exposition()``. ``treadle.metrics.world`` refreshes the gauges read from the World
(open runs by status, dead letters, backlog) before a scrape; ``treadle.metrics.server``
is the worker's small HTTP endpoint (``treadle worker --metrics-port``) and
``treadle.serve.metricsroute`` serve's ``GET /metrics``.

Label sets are bounded: message kind (``orchestrator``, ``step``), delivery result
(``ack``, ``redeliver``, ``handoff``, ``error``, ``cancelled``), event type, run
status, and the step name only when the app's registry has that step
(``unregistered`` otherwise), never a run id. Without ``prometheus-client`` installed
every recorder is a no-op and ``exposition()`` says so in a comment.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

try:
    import prometheus_client as prom

    AVAILABLE = True
except ImportError:  # pragma: no cover - the base install has no prometheus-client
    AVAILABLE = False

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
UNREGISTERED: Final = "unregistered"
OPEN_STATUSES: Final = ("pending", "running")
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)


class _State:
    # Set once something exposes the metrics (a worker's --metrics-port, serve's route).
    enabled = False


def enable(on: bool = True) -> None:
    """Record metrics from now on (Worlds opened later are instrumented); ``False`` stops."""
    _State.enabled = on


def enabled() -> bool:
    return AVAILABLE and _State.enabled


if AVAILABLE:
    REGISTRY = prom.CollectorRegistry(auto_describe=True)
    DELIVERIES = prom.Counter(
        "treadle_deliveries",
        "Deliveries handled, by message kind and result (ack, redeliver, handoff, error, "
        "cancelled).",
        ["kind", "result"],
        registry=REGISTRY,
    )
    DELIVERY_SECONDS = prom.Histogram(
        "treadle_delivery_duration_seconds",
        "How long one delivery's handler ran, by message kind.",
        ["kind"],
        buckets=_DURATION_BUCKETS,
        registry=REGISTRY,
    )
    REDELIVERIES = prom.Counter(
        "treadle_redeliveries",
        "Deliveries of a message the queue had delivered before (attempt above 1).",
        ["kind"],
        registry=REGISTRY,
    )
    HANDOFFS = prom.Counter(
        "treadle_handoffs",
        "Deliveries that answered Handoff, by message kind.",
        ["kind"],
        registry=REGISTRY,
    )
    COALESCED_RERUNS = prom.Counter(
        "treadle_coalesced_reruns",
        "Re-runs of a delivery for messages coalesced into it (spec 9 queue rule).",
        registry=REGISTRY,
    )
    FENCE_REFUSALS = prom.Counter(
        "treadle_fence_refusals",
        "In-band writes the World refused as superseded (InBandSuperseded).",
        registry=REGISTRY,
    )
    WORLD_WRITES = prom.Counter(
        "treadle_world_writes",
        "Event writes to the World, by event type and in-band or not.",
        ["event_type", "in_band"],
        registry=REGISTRY,
    )
    WORLD_REFUSALS = prom.Counter(
        "treadle_world_refusals",
        "Event writes the World refused (a stale start, a second outcome...), by refusal.",
        ["refusal"],
        registry=REGISTRY,
    )
    SENDS = prom.Counter(
        "treadle_sends", "Messages sent to the queue, by kind.", ["kind"], registry=REGISTRY
    )
    STEP_ATTEMPTS = prom.Counter(
        "treadle_step_attempts",
        "Step attempts run, by step and outcome (completed, retry, failed).",
        ["step", "outcome"],
        registry=REGISTRY,
    )
    STEP_SECONDS = prom.Histogram(
        "treadle_step_duration_seconds",
        "How long one step attempt's body ran, by step.",
        ["step"],
        buckets=_DURATION_BUCKETS,
        registry=REGISTRY,
    )
    QUEUE_LAG = prom.Histogram(
        "treadle_queue_lag_seconds",
        "Delivery start minus the message's due time, by kind (queues that know it).",
        ["kind"],
        buckets=_LAG_BUCKETS,
        registry=REGISTRY,
    )
    OPEN_RUNS = prom.Gauge(
        "treadle_open_runs",
        "Runs not ended, by status (World-wide; read with runs.count before a scrape).",
        ["status"],
        registry=REGISTRY,
    )
    DEAD_LETTERS = prom.Gauge(
        "treadle_dead_letters",
        "Messages in the queue's dead letters (counted up to a bound before a scrape).",
        registry=REGISTRY,
    )
    BACKLOG = prom.Gauge(
        "treadle_queue_backlog",
        "Messages of this deployment due or in flight, by kind (queue.backlog).",
        ["kind"],
        registry=REGISTRY,
    )


def delivery(
    kind: str, result: str, seconds: float, *, attempt: int, rerun: int, lag: float | None
) -> None:
    if not enabled():
        return
    DELIVERIES.labels(kind, result).inc()
    DELIVERY_SECONDS.labels(kind).observe(seconds)
    if result == "handoff":
        HANDOFFS.labels(kind).inc()
    if rerun > 0:
        COALESCED_RERUNS.inc()
    elif attempt > 1:
        REDELIVERIES.labels(kind).inc()
    if lag is not None:
        QUEUE_LAG.labels(kind).observe(max(lag, 0.0))


def write(event_types: Iterable[str], in_band: bool) -> None:
    if not enabled():
        return
    for event_type in event_types:
        WORLD_WRITES.labels(event_type, "true" if in_band else "false").inc()


def refusal(name: str) -> None:
    if not enabled():
        return
    if name == "InBandSuperseded":
        FENCE_REFUSALS.inc()
    WORLD_REFUSALS.labels(name).inc()


def sent(kinds: Iterable[str]) -> None:
    if not enabled():
        return
    for kind in kinds:
        SENDS.labels(kind).inc()


def step_attempt(step: str, outcome: str, seconds: float) -> None:
    if not enabled():
        return
    STEP_ATTEMPTS.labels(step, outcome).inc()
    STEP_SECONDS.labels(step).observe(seconds)


def exposition() -> bytes:
    """Every treadle metric in the Prometheus text format."""
    if not AVAILABLE:
        return b"# prometheus-client is not installed: pip install 'treadle[observability]'\n"
    data: bytes = prom.generate_latest(REGISTRY)
    return data
