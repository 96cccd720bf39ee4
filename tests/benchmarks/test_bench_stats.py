"""The comparison's arithmetic: percentiles, and which way a ratio points.

A ratio above 1 means treadle is better, whether the metric is a time (lower is
better) or a rate (higher is better); ``ms_per_step`` is a time, though its name
contains ``per_s``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # benchmarks/ is a top-level package of the repository, not installed
    sys.path.insert(0, ROOT)

from benchmarks import stats  # noqa: E402


@pytest.mark.parametrize(
    ("metric", "treadle", "peer", "expected"),
    [
        ("ms_per_step@250", 2.0, 10.0, 5.0),
        ("ttfs_ms", 10.0, 5.0, 0.5),
        ("runs_per_s@1step", 500.0, 100.0, 5.0),
        ("steps_per_s@10step", 70.0, 140.0, 0.5),
    ],
)
def test_advantage_is_above_one_when_treadle_is_better(
    metric: str, treadle: float, peer: float, expected: float
) -> None:
    assert stats.advantage(metric, treadle, peer) == pytest.approx(expected)


def test_percentiles_interpolate_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0, 5.0]
    assert stats.percentile(values, 0.5) == 3.0
    assert stats.percentile(values, 0.9) == pytest.approx(4.6)
    assert stats.summary([7.0]) == {"p50": 7.0, "p90": 7.0, "n": 1}
