"""The operator's /metrics gains the runs not ended per WorkflowDeployment (issue 13
item 4), recorded by each reconcile from the ``runs.count`` it already makes, and
forgotten with the WorkflowDeployment."""

from __future__ import annotations

from treadle_operator import metrics


def test_active_runs_per_workflow_deployment_are_exposed_and_forgotten() -> None:
    metrics.world_load("shop", "orders", 7)
    text = metrics.exposition()
    assert "# TYPE treadle_operator_active_runs gauge" in text
    assert 'treadle_operator_active_runs{deployment="orders",namespace="shop"} 7' in text
    metrics.world_load("shop", "orders", 2)
    assert metrics.ACTIVE_RUNS.get(namespace="shop", deployment="orders") == 2
    metrics.forget_deployment("shop", "orders")
    assert metrics.ACTIVE_RUNS.get(namespace="shop", deployment="orders") is None
    assert 'deployment="orders"' not in metrics.exposition()
