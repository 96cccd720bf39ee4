"""``spec.revisions.<id>: {action: MoveRuns, to: <id>}`` on the real API server (issue 11
item 5; review operator.md §1 "Moving pinned runs"; docs/operator-templates.md).

A run waits on a hook on revision A (image shop:1); a new image makes revision B and A
drains; MoveRuns moves the run (``approval`` declares ``compatible="approval-v1"`` in
both images' catalogues) to B, whose orchestrator replays A's log; the hook resumes the
run on B (its second step reports shop:2), and A, with no run left, retires. The
operator runs as the chart's service account (``operator_env``): moving needs no verb
beyond what the World already gets.
"""

from __future__ import annotations

import json

from .harness import wait_for
from .operator_env import Shop
from .test_operator import (
    nats_server,
    operator_kubeconfig,
    pg_clones,
    pg_server,
    shop,
    shop_factory,
)
from .test_operator_template import _patch, _revisions

__all__ = [
    "nats_server", "operator_kubeconfig", "pg_clones", "pg_server", "shop", "shop_factory"
]  # fmt: skip


def test_move_runs_moves_a_waiting_run_to_the_new_revision_where_it_finishes(
    shop: Shop,
) -> None:
    """MoveRuns: the World run's deployment becomes B (``run_repinned`` in its log), the
    run completes on B after its hook (the WorkflowRun's revision follows), a Normal Event
    says how many moved, and the drained A retires."""
    old = shop.latest()
    _patch(shop, {"retireAfterSeconds": 0})
    shop.start("moving", "approval", {"order_id": "mv"})
    wait_for(lambda: shop.status("moving").get("waitingOn"), 60, what="the run waiting")
    run_id = shop.status("moving")["runId"]

    _patch(shop, {"image": "shop:2"})
    new = wait_for(lambda: (r := shop.latest()) != old and r, 90, what="the new revision")
    wait_for(lambda: _revisions(shop)[old]["phase"] == "Draining" or None, 30, what="draining")

    _patch(shop, {"revisions": {old: {"action": "MoveRuns", "to": new, "reason": "hotfix"}}})
    wait_for(
        lambda: shop.world_run(run_id)["deployment_id"] == new or None,
        60,
        what="the run moved to the new revision",
    )
    timeline = shop.cli("inspect", run_id, "--json")
    assert timeline.returncode == 0, timeline.stderr
    moved = [e for e in json.loads(timeline.stdout)["events"] if e["type"] == "run_repinned"]
    assert [(e["event"]["from_deployment"], e["event"]["to_deployment"]) for e in moved] == [
        (old, new)
    ]

    resumed = shop.cli("hooks", "resume", "approve:mv", "--payload", '{"approved": true}')
    assert resumed.returncode == 0, resumed.stderr
    done = shop.phase("moving", "Completed", timeout=90)
    assert json.loads(done["output"]) == {"approved": True, "before": "shop:1", "after": "shop:2"}
    assert done["revision"] == new, "the WorkflowRun shows the revision the run is on now"
    wait_for(lambda: _revisions(shop)[old]["phase"] == "Retired" or None, 60, what="A retired")
    events = shop.kube.rest.get(
        f"/api/v1/namespaces/{shop.namespace}/events"
        f"?fieldSelector=involvedObject.name={shop.deployment}"
    )["items"]
    assert f"revision {old}: 1 pinned run(s) moved to revision {new} (hotfix)" in [
        e["message"] for e in events if e["reason"] == "RevisionAction" and e["type"] == "Normal"
    ]
