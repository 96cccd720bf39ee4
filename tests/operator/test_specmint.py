"""The run format the operator mints for a WorkflowRun (issue 12's kill switch for
kubectl-started runs): the deployment's own WORKFLOW_SPEC_VERSION, as its workers read it.

Against a real API server: tests/k8s/test_operator_spec_version.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from treadle.world import contract
from treadle_operator import specmint
from treadle_operator.models import WorkflowDeploymentSpec

FENCED = contract.Capabilities(
    in_band_fence=True, serializes_runs=True, coalesces=True, live_feed=True
)
UNFENCED = contract.Capabilities(
    in_band_fence=False, serializes_runs=False, coalesces=False, live_feed=True
)


def _spec(
    env: list[dict[str, Any]] | None = None, worker_env: Any = None
) -> WorkflowDeploymentSpec:
    body: dict[str, Any] = {"image": "shop:1", "module": "shop"}
    if env is not None:
        body["env"] = env
    if worker_env is not None:
        body["template"] = {
            "spec": {"containers": [{"name": "sidecar", "env": [
                {"name": "WORKFLOW_SPEC_VERSION", "value": "7"}]},
                {"name": "worker", "env": worker_env}]}
        }  # fmt: skip
    return WorkflowDeploymentSpec.model_validate(body)


def test_unset_mints_9_on_a_fenced_world_and_8_without_the_fence() -> None:
    assert specmint.version_for(_spec(), FENCED) == 9
    assert specmint.version_for(_spec(), UNFENCED) == 8


def test_the_deployments_env_8_is_the_kill_switch_for_runs_the_operator_starts() -> None:
    spec = _spec([{"name": "WORKFLOW_SPEC_VERSION", "value": "8"}])
    assert specmint.version_for(spec, FENCED) == 8
    assert specmint.refusal(spec) is None


def test_the_worker_containers_env_counts_and_spec_env_wins_over_it() -> None:
    worker = [{"name": "WORKFLOW_SPEC_VERSION", "value": "8"}]
    assert specmint.version_for(_spec(worker_env=worker), FENCED) == 8  # the sidecar's 7 ignored
    both = _spec([{"name": "WORKFLOW_SPEC_VERSION", "value": "9"}], worker_env=worker)
    assert specmint.version_for(both, FENCED) == 9


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        (
            {"name": "WORKFLOW_SPEC_VERSION", "value": "7"},
            "spec.env[1] sets WORKFLOW_SPEC_VERSION='7'",
        ),
        ({"name": "WORKFLOW_SPEC_VERSION", "value": "nine"}, "allowed values are 8 or 9"),
        (
            {
                "name": "WORKFLOW_SPEC_VERSION",
                "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}},
            },
            "does not resolve valueFrom",
        ),
    ],
)
def test_a_value_the_workers_would_refuse_refuses_the_deployment_naming_the_entry(
    entry: dict[str, Any], says: str
) -> None:
    spec = _spec([{"name": "OTHER", "value": "x"}, entry])
    problem = specmint.refusal(spec)
    assert problem is not None and says in problem
    with pytest.raises(specmint.InvalidSpecVersion):
        specmint.version_for(spec, FENCED)
