"""Review R11: revisions found again from their Deployments' labels when status was lost."""

from __future__ import annotations

from typing import Any

from treadle_operator import manifests, recovery, revisions
from treadle_operator.models import WorkflowDeploymentSpec, WorkflowDeploymentStatus


def _deployments(number: int, image: str, uid: str = "u-1") -> list[dict[str, Any]]:
    spec = WorkflowDeploymentSpec(image=image, module="orders.app")
    revision = revisions.revision_id("ns", "orders", uid, number, image, "orders.app")
    made = []
    for role in manifests.ROLES:
        body = manifests.worker_deployment(
            owner="orders", owner_uid=uid, namespace="ns", revision=revision, image=image,
            module="orders.app", spec=spec, role=role, replicas=1,
        )  # fmt: skip
        body["metadata"]["creationTimestamp"] = f"2026-11-30T00:0{number}:00Z"
        made.append(body)
    return made


def test_revisions_and_their_numbers_come_back_from_the_deployments() -> None:
    found = _deployments(2, "img:2") + _deployments(1, "img:1") + _deployments(1, "x", uid="other")
    recovered, highest = recovery.from_deployments("ns", "orders", "u-1", found)
    assert [(r.image, r.phase) for r in recovered] == [("img:1", "Draining"), ("img:2", "Draining")]
    assert highest == 2


def test_after_a_rebuild_the_current_one_is_latest_the_old_one_retires_and_numbering_goes_on() -> (
    None
):
    recovered, highest = recovery.from_deployments(
        "ns", "orders", "u-1", _deployments(1, "img:1") + _deployments(2, "img:2")
    )
    old, current = (r.id for r in recovered)
    status = WorkflowDeploymentStatus(revisions=recovered, revision_count=highest)
    spec = WorkflowDeploymentSpec(image="img:2", module="orders.app", retire_after_seconds=0)
    ready = {old: revisions.Observed(ready=True), current: revisions.Observed(ready=True)}
    plan = revisions.plan(
        namespace="ns", name="orders", uid="u-1", generation=3, spec=spec, status=status,
        observed=ready, now="2026-11-30T01:00:00Z",
    )  # fmt: skip
    assert plan.created is None
    assert plan.status.latest_revision == current
    assert [r.phase for r in plan.status.revisions] == ["Retired", "Active"]
    assert plan.retire == (old,)
    spec3 = spec.model_copy(update={"image": "img:3"})
    third = revisions.plan(
        namespace="ns", name="orders", uid="u-1", generation=4, spec=spec3, status=plan.status,
        observed=ready, now="2026-11-30T01:00:05Z",
    )  # fmt: skip
    assert third.created == revisions.revision_id("ns", "orders", "u-1", 3, "img:3", "orders.app")
