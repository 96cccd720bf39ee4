"""The operator's Prometheus metrics, and their text exposition (format 0.0.4).

A handful of counters, gauges and one histogram, kept in this process and
rendered by ``exposition()`` for ``GET /metrics`` (``treadle_operator.probes``).
Written here rather than taken from ``prometheus-client`` so that the operator
image needs no new dependency; the format is the small text one every
Prometheus (and the ServiceMonitor of the chart) scrapes.

Who records what:

- ``runs.start`` counts a run it recorded (``RUNS_STARTED``); ``sync`` counts a
  run's end (``RUNS_FINISHED``, by phase) when it sees the phase change;
- ``handlers`` times every WorkflowDeployment and WorkflowRun reconcile
  (``timed``: ``RECONCILE_SECONDS``, and ``RECONCILE_ERRORS`` for one that raised);
- ``deployments.reconcile`` records whether each WorkflowDeployment's World was
  reachable (``WORLD_REACHABLE``, 1 or 0), which ``probes`` also reads for readiness;
- ``deployments.reconcile`` also records the runs not ended on each WorkflowDeployment's
  live revisions (``ACTIVE_RUNS``, from the ``runs.count`` it makes anyway);
- ``signals`` counts WorkflowSignals handled (``SIGNALS``, by action and phase) and
  those seen again already handled (``SIGNALS_ALREADY_HANDLED``);
- ``TRACKED_RUNS`` is read at scrape time from the status sync.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]


def _labels(values: dict[str, str]) -> Labels:
    return tuple(sorted(values.items()))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _render(name: str, labels: Labels, value: float) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    shown = "+Inf" if value == math.inf else repr(float(value)) if value % 1 else str(int(value))
    return f"{name}{{{inner}}} {shown}" if inner else f"{name} {shown}"


@dataclass
class Counter:
    name: str
    help: str
    values: dict[Labels, float] = field(default_factory=dict)
    kind: str = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = _labels(labels)
        self.values[key] = self.values.get(key, 0.0) + amount

    def get(self, **labels: str) -> float:
        return self.values.get(_labels(labels), 0.0)

    def lines(self) -> list[str]:
        return [_render(self.name, k, v) for k, v in sorted(self.values.items())]


@dataclass
class Gauge:
    name: str
    help: str
    values: dict[Labels, float] = field(default_factory=dict)
    read: Callable[[], float] | None = None  # a gauge computed when scraped
    kind: str = "gauge"

    def set(self, value: float, **labels: str) -> None:
        self.values[_labels(labels)] = value

    def remove(self, **labels: str) -> None:
        self.values.pop(_labels(labels), None)

    def get(self, **labels: str) -> float | None:
        return self.values.get(_labels(labels))

    def lines(self) -> list[str]:
        if self.read is not None:
            return [_render(self.name, (), self.read())]
        return [_render(self.name, k, v) for k, v in sorted(self.values.items())]


BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class Histogram:
    name: str
    help: str
    buckets: tuple[float, ...] = BUCKETS
    counts: dict[Labels, list[int]] = field(default_factory=dict)
    sums: dict[Labels, float] = field(default_factory=dict)
    kind: str = "histogram"

    def observe(self, value: float, **labels: str) -> None:
        key = _labels(labels)
        counts = self.counts.setdefault(key, [0] * (len(self.buckets) + 1))
        for i, bound in enumerate((*self.buckets, math.inf)):
            if value <= bound:
                counts[i] += 1
        self.sums[key] = self.sums.get(key, 0.0) + value

    def count(self, **labels: str) -> int:
        return (self.counts.get(_labels(labels)) or [0])[-1]

    def lines(self) -> list[str]:
        out: list[str] = []
        for key, counts in sorted(self.counts.items()):
            for bound, seen in zip((*self.buckets, math.inf), counts, strict=True):
                le = "+Inf" if bound == math.inf else repr(bound)
                out.append(_render(f"{self.name}_bucket", (*key, ("le", le)), seen))
            out.append(_render(f"{self.name}_sum", key, self.sums[key]))
            out.append(_render(f"{self.name}_count", key, counts[-1]))
        return out


Metric = Counter | Gauge | Histogram

RUNS_STARTED = Counter(
    "treadle_operator_runs_started_total", "Runs the operator recorded for WorkflowRuns."
)
RUNS_FINISHED = Counter(
    "treadle_operator_runs_finished_total",
    "Runs of tracked WorkflowRuns seen ending, by phase (Completed, Failed, Cancelled).",
)
TRACKED_RUNS = Gauge(
    "treadle_operator_tracked_runs", "WorkflowRuns whose status the operator keeps in step."
)
RECONCILE_SECONDS = Histogram(
    "treadle_operator_reconcile_duration_seconds", "How long one reconcile took, by kind."
)
RECONCILE_ERRORS = Counter(
    "treadle_operator_reconcile_errors_total", "Reconciles that raised (retried), by kind."
)
WORLD_REACHABLE = Gauge(
    "treadle_operator_world_reachable",
    "1 when the last reconcile of a WorkflowDeployment reached its World, else 0.",
)
ACTIVE_RUNS = Gauge(
    "treadle_operator_active_runs",
    "Runs not ended (pending or running) on a WorkflowDeployment's live revisions, as of "
    "its last reconcile (runs.count).",
)
SIGNALS = Counter("treadle_operator_signals_total", "WorkflowSignals handled, by action and phase.")
SIGNALS_ALREADY_HANDLED = Counter(
    "treadle_operator_signals_already_handled_total",
    "WorkflowSignals seen again (operator start, re-list) that were handled: not done again.",
)

ALL: tuple[Metric, ...] = (
    RUNS_STARTED,
    RUNS_FINISHED,
    TRACKED_RUNS,
    RECONCILE_SECONDS,
    RECONCILE_ERRORS,
    WORLD_REACHABLE,
    ACTIVE_RUNS,
    SIGNALS,
    SIGNALS_ALREADY_HANDLED,
)


def exposition(metrics: tuple[Metric, ...] = ALL) -> str:
    """Every metric in the Prometheus text format."""
    out: list[str] = []
    for metric in metrics:
        out.append(f"# HELP {metric.name} {metric.help}")
        out.append(f"# TYPE {metric.name} {metric.kind}")
        out.extend(metric.lines())
    return "\n".join(out) + "\n"


RECONCILED: set[tuple[str, str]] = set()  # (namespace, name) reconciled once (readiness)


@contextlib.contextmanager
def timed(
    kind: str,
    expected: tuple[type[BaseException], ...] = (),
    done: tuple[str, str] | None = None,
) -> Iterator[None]:
    """Time one reconcile of ``kind``; an exception not in ``expected`` counts as an error.
    ``done`` (namespace, name) joins ``RECONCILED`` however the reconcile ends."""
    began = time.monotonic()
    try:
        yield
    except expected:
        raise
    except BaseException:
        RECONCILE_ERRORS.inc(kind=kind)
        raise
    finally:
        RECONCILE_SECONDS.observe(time.monotonic() - began, kind=kind)
        if done is not None:
            RECONCILED.add(done)


def world_reachable(namespace: str, deployment: str, reachable: bool) -> None:
    WORLD_REACHABLE.set(1.0 if reachable else 0.0, namespace=namespace, deployment=deployment)


def world_load(namespace: str, deployment: str, active_runs: int) -> None:
    """The runs a WorkflowDeployment's reconcile counted on its World (issue 13 item 4)."""
    ACTIVE_RUNS.set(float(active_runs), namespace=namespace, deployment=deployment)


def forget_deployment(namespace: str, deployment: str) -> None:
    WORLD_REACHABLE.remove(namespace=namespace, deployment=deployment)
    ACTIVE_RUNS.remove(namespace=namespace, deployment=deployment)
    RECONCILED.discard((namespace, deployment))
