"""The simulation counts optimistic starts' one residual risk and hides nothing.

Turbo's early inline bodies (on by default) and the opt-in
``WORKFLOW_OPTIMISTIC_BACKGROUND_START`` start a body before its ``step_started``
commits; when that start is then refused, the body ran without a committed start
and a redelivery runs it again (docs/turbo.md). The invariants count each such body
run as ``body_before_refused_start`` (reported by every soak), and fail it for a
``max_retries=0`` step (``unstarted_body``). Seeds found by the soak
``--seeds 200 --start 1000`` (``--spec mixed``) with such a body, under their plans.
"""

from __future__ import annotations

import pytest

from treadle.testing.simulation import Config, FaultPlan, simulate

# seed, plan: a fence refusal of a turbo delivery's run_started after its early body ran.
RESIDUAL_SEEDS = [
    (1062, "crash=0.002,feed_drop=0.005,fence=0.003,kill_owner=0.01,lapse=0.012,budget=8"),
    (
        1096,
        "duplicate=0.01,feed_drop=0.0025,fence=0.003,lapse=0.006,lost_wake=0.004,pause=0.002,"
        "stall=0.003,budget=8",
    ),
]


@pytest.mark.parametrize(("seed", "plan"), RESIDUAL_SEEDS, ids=[str(s) for s, _ in RESIDUAL_SEEDS])
def test_a_body_run_before_its_refused_start_is_counted_not_failed(seed: int, plan: str) -> None:
    """With optimistic starts at their defaults, the seed holds every invariant and
    reports at least one ``body_before_refused_start``; with them off (both), it holds
    every invariant and reports none: the count names exactly the optimistic starts."""
    on = simulate(seed, Config(plan=FaultPlan.parse(plan), spec="mixed"))
    assert on.ok, [str(v) for v in on.violations]
    assert on.residuals["body_before_refused_start"] >= 1
    off = simulate(seed, Config(plan=FaultPlan.parse(plan), spec="mixed", optimistic="off"))
    assert off.ok, [str(v) for v in off.violations]
    assert off.residuals["body_before_refused_start"] == 0
