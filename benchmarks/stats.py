"""Percentiles and the comparison of treadle against each peer."""

from __future__ import annotations

import math


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary(values: list[float]) -> dict[str, float | int]:
    return {"p50": percentile(values, 0.5), "p90": percentile(values, 0.9), "n": len(values)}


def higher_is_better(metric: str) -> bool:
    """Rates (``runs_per_s@...``, ``steps_per_s@...``) and the share of runs woken in
    time; every other metric is a time or a size (lower is better)."""
    return metric.startswith(("runs_per_s@", "steps_per_s@", "woke_within_1s_pct"))


# Figures that describe the setup, not how well a system did: no ratio.
NOT_COMPARED = ("sleeping_at_once", "log_events@")


def advantage(metric: str, treadle: float, peer: float) -> float:
    """How many times better treadle is (above 1: treadle wins), whatever the metric's sense."""
    if metric.startswith(NOT_COMPARED):
        return math.nan
    if treadle <= 0 or peer <= 0 or math.isnan(treadle) or math.isnan(peer):
        return math.nan
    return treadle / peer if higher_is_better(metric) else peer / treadle
