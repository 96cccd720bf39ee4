"""WORKFLOW_SPEC_VERSION on a WorkflowDeployment against the real API server (issue 12's
kill switch): the operator mints the WorkflowRuns it starts in the deployment's format, and
a value the workers would refuse refuses the deployment before anything is deployed.

The rules without a cluster: tests/operator/test_specmint.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from .harness import Kube, wait_for
from .operator_env import Shop
from .test_operator import (
    nats_server,
    operator_kubeconfig,
    pg_clones,
    pg_server,
    shop,
    shop_factory,
)

__all__ = [
    "nats_server", "operator_kubeconfig", "pg_clones", "pg_server", "shop", "shop_factory"
]  # fmt: skip


def test_a_deployment_with_spec_version_8_runs_kubectl_started_runs_as_spec_8(
    shop_factory: Callable[[], Shop],
) -> None:
    """The kill switch: WORKFLOW_SPEC_VERSION=8 in spec.env; a WorkflowRun applied after
    it is a spec 8 run in the World and completes on the deployment's workers."""
    shop = shop_factory()
    shop.secret()
    shop.operator.start()
    shop.deploy(shop.deployment, "shop:1", env=[{"name": "WORKFLOW_SPEC_VERSION", "value": "8"}])
    shop.latest()
    shop.start("legacy", "greet", {"name": "eight"})
    status = shop.phase("legacy", "Completed", timeout=90)
    assert json.loads(status["output"]) == {"hello": "eight", "image": "shop:1"}
    assert shop.world_run(status["runId"])["spec_version"] == 8


def test_a_run_applied_without_the_setting_is_spec_9(shop: Shop) -> None:
    shop.start("current", "greet", {"name": "nine"})
    status = shop.phase("current", "Completed", timeout=90)
    assert shop.world_run(status["runId"])["spec_version"] == 9


def test_a_spec_version_the_workers_would_refuse_refuses_the_deployment(
    shop_factory: Callable[[], Shop], kube: Kube
) -> None:
    shop = shop_factory()
    shop.secret()
    shop.operator.start()
    shop.deploy("seven", "shop:1", env=[{"name": "WORKFLOW_SPEC_VERSION", "value": "7"}])

    def refused() -> dict[str, str] | None:
        conditions = (shop.wfd("seven").get("status") or {}).get("conditions", [])
        found = [c for c in conditions if c["type"] == "SpecAccepted" and c["status"] == "False"]
        return found[0] if found else None

    condition = wait_for(refused, 30, what="SpecAccepted False")
    assert condition["reason"] == "InvalidSpecVersion"
    assert condition["message"].startswith("spec.env[0] sets WORKFLOW_SPEC_VERSION='7'")
    deployments = kube.rest.get(
        f"/apis/apps/v1/namespaces/{shop.namespace}/deployments"
        "?labelSelector=treadle.dev/deployment=seven"
    )
    assert deployments["items"] == []
