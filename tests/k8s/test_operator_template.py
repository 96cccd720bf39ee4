"""spec.template and pinning you can afford, on the real API server (issue 11 items 4 and 5;
review operator.md §1 rows "Pod template passthrough", "Sunset", "Rollback", "Moving pinned
runs", §2 items 2, 3, 4).

A template's nodeSelector, tolerations, labels, annotations, volumes and imagePullSecrets
reach the worker Deployments; a Git change to env or resources rolls the current
revision's Deployments in place (no new revision) while a draining revision keeps its own
pod template at the draining replicas; the previous image set back is the previous
revision again; ``spec.revisions.<id>: {action: CancelRuns}`` cancels the runs pinned to a
bad revision, and is refused on the revision that takes new runs. What is asserted is read
back through the API; the workers run on the node ``pod_node`` chose, whose own part of the
template (the real node's host network, taint and label) ``shop.pods.template`` adds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

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

__all__ = [
    "nats_server", "operator_kubeconfig", "pg_clones", "pg_server", "shop", "shop_factory"
]  # fmt: skip

HASH = "treadle.dev/template-hash"
TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "shop"}, "annotations": {"example.com/owner": "payments"}},
    "spec": {
        "imagePullSecrets": [{"name": "registry-credentials"}],
        "nodeSelector": {"kubernetes.io/os": "linux"},  # the test node has it
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "treadle",
                         "effect": "NoSchedule"}],
        "volumes": [{"name": "cache", "emptyDir": {}}],
        "containers": [{"name": "worker",
                        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                        "env": [{"name": "FROM_TEMPLATE", "value": "yes"}]}],
    },
}  # fmt: skip


def _deployment(shop: Shop, name: str) -> dict[str, Any]:
    found: dict[str, Any] = shop.kube.rest.get(
        f"/apis/apps/v1/namespaces/{shop.namespace}/deployments/{name}"
    )
    return found


def _pod_template(shop: Shop, revision: str, role: str = "steps") -> dict[str, Any]:
    template: dict[str, Any] = _deployment(shop, f"{revision}-{role}")["spec"]["template"]
    return template


def _hash(shop: Shop, revision: str, role: str = "steps") -> str:
    return str(_pod_template(shop, revision, role)["metadata"]["annotations"][HASH])


def _env(template: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}


def _revisions(shop: Shop) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in shop.wfd()["status"]["revisions"]}


def _patch(shop: Shop, spec: dict[str, Any]) -> None:
    shop.patch(spec)


def _replicas(shop: Shop, revision: str) -> dict[str, int]:
    return {
        role: _deployment(shop, f"{revision}-{role}")["spec"]["replicas"]
        for role in ("orchestrator", "steps")
    }


def test_a_template_reaches_the_workers_and_env_or_resources_changes_roll_them_in_place(
    shop_factory: Callable[[], Shop],
) -> None:
    """Item 4: the template passes through under what the operator owns; an env or
    resources change in Git rolls the Deployments (new pod template, new hash) without a new
    revision; a key dropped from the template leaves the Deployment (replaced, not merged)."""
    shop = shop_factory()
    shop.secret()
    shop.operator.start()
    shop.deploy(shop.deployment, "shop:1", template=TEMPLATE)
    revision = shop.latest()
    for role in ("orchestrator", "steps"):
        template = _pod_template(shop, revision, role)
        spec = template["spec"]
        on_node = shop.pods.template(TEMPLATE)
        assert on_node is not None
        assert spec["nodeSelector"] == on_node["spec"]["nodeSelector"]
        assert spec["nodeSelector"]["kubernetes.io/os"] == "linux"
        assert spec["tolerations"][0]["key"] == "dedicated"
        assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
        assert {v["name"] for v in spec["volumes"]} >= {"cache", "tmp"}
        assert template["metadata"]["labels"]["team"] == "shop"
        assert template["metadata"]["labels"]["treadle.dev/revision"] == revision
        assert template["metadata"]["annotations"]["example.com/owner"] == "payments"
        worker = spec["containers"][0]
        assert worker["name"] == "worker" and worker["image"] == "shop:1"
        assert worker["args"][:3] == ["worker", worker["args"][1], "--role"]
        assert {m["mountPath"] for m in worker["volumeMounts"]} >= {"/cache", "/tmp"}
        assert _env(template)["FROM_TEMPLATE"] == "yes"
        assert _env(template)["TREADLE_DEPLOYMENT_ID"] == revision
        assert worker["securityContext"]["readOnlyRootFilesystem"] is True
    pods = shop.kube.pods(shop.namespace, f"treadle.dev/revision={revision}")
    assert pods and all(p["metadata"]["labels"]["team"] == "shop" for p in pods)  # type: ignore[index]
    shop.start("before", "greet", {"name": "template"})
    assert shop.phase("before", "Completed")["revision"] == revision
    before = {role: _hash(shop, revision, role) for role in ("orchestrator", "steps")}
    recorded = _revisions(shop)[revision]["templateHash"]
    assert recorded == f"{before['orchestrator']}/{before['steps']}"
    count = shop.wfd()["status"]["revisionCount"]

    _patch(shop, {"env": [{"name": "GREETING", "value": "hi"}],
                  "steps": {"resources": {"requests": {"cpu": "50m"}}}})  # fmt: skip
    rolled = wait_for(
        lambda: t if _env(t := _pod_template(shop, revision)).get("GREETING") == "hi" else None,
        30,
        what="the env change on the steps Deployment",
    )
    assert rolled["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "50m"}}
    assert rolled["metadata"]["annotations"][HASH] != before["steps"]
    assert _env(_pod_template(shop, revision, "orchestrator")).get("GREETING") == "hi"
    wfd = shop.wfd()
    assert wfd["status"]["revisionCount"] == count, "env/resources roll, no new revision"
    assert wfd["status"]["latestRevision"] == revision
    wait_for(
        lambda: _revisions(shop)[revision]["templateHash"] != recorded or None,
        30,
        what="the new template hash in status",
    )
    # The rolled workers come up and serve (the Deployment made new pods).
    wait_for(
        lambda: (
            _deployment(shop, f"{revision}-steps")["status"].get("updatedReplicas") == 1 or None
        ),
        60,
        what="the steps Deployment rolled out",
    )
    shop.start("after", "greet", {"name": "rolled"})
    assert shop.phase("after", "Completed")["revision"] == revision

    # The template's nodeSelector key dropped (the real node's own label stays there).
    _patch(shop, {"template": {"spec": {"nodeSelector": {"kubernetes.io/os": None}}}})
    left = (shop.pods.template({"spec": {}}) or {"spec": {}})["spec"].get("nodeSelector")
    wait_for(
        lambda: _pod_template(shop, revision)["spec"].get("nodeSelector") == left or None,
        30,
        what="the dropped nodeSelector gone from the Deployment",
    )

    bad = {"containers": [{"name": "worker", "command": ["sh"]}]}
    _patch(shop, {"template": {"spec": bad}})

    def refused() -> dict[str, Any] | None:
        conditions = {c["type"]: c for c in shop.wfd()["status"]["conditions"]}
        accepted = conditions.get("SpecAccepted", {})
        return accepted if accepted.get("reason") == "InvalidTemplate" else None

    accepted = wait_for(refused, 30, what="SpecAccepted=False for a template setting command")
    assert accepted["status"] == "False"
    assert "spec.template.spec.containers[0] (worker) sets command" in accepted["message"]
    assert _pod_template(shop, revision)["spec"]["containers"][0]["command"] == ["treadle"]

    # A field only the API server can judge: its refusal is the condition, in one line.
    _patch(shop, {"template": {"spec": {"containers": [{"name": "worker"}], "nodeSelector": "x"}}})
    refused_by_server = wait_for(
        lambda: (c := refused()) and "the API server refused Deployment" in c["message"] and c,
        30,
        what="the API server's refusal as SpecAccepted=False",
    )
    assert f"{revision}-" in refused_by_server["message"]
    assert "nodeSelector" in refused_by_server["message"]
    assert "\n" not in refused_by_server["message"]


def test_draining_is_cheap_rollback_reuses_the_revision_and_cancel_runs_ends_pinned_runs(
    shop: Shop,
) -> None:
    """Item 5: the old revision drains at draining.replicas (1 orchestrator, 0 step workers)
    with its own pod template while the new one rolls on an env change, and a pinned run
    that wakes there gets a step worker from its backlog; the previous image
    set back is the previous revision (same id, no new revision); CancelRuns cancels the
    runs pinned to the bad revision, which then retires, and is refused on the latest."""
    good = shop.latest()
    # Retire a drained revision at once (retireAfterSeconds, R1's delay, where the schema has
    # it; a field the schema lacks is pruned by the API server).
    _patch(shop, {"retireAfterSeconds": 0})
    shop.start("on-good", "approval", {"order_id": "good"})
    shop.start("hold-good", "approval", {"order_id": "hold"})  # keeps good draining throughout
    for run in ("on-good", "hold-good"):
        wait_for(lambda: shop.status(run).get("waitingOn"), 60, what=f"{run} waiting")  # noqa: B023

    _patch(shop, {"image": "shop:2"})
    bad = wait_for(lambda: (r := shop.latest()) != good and r, 90, what="the new revision")
    wait_for(
        lambda: _revisions(shop)[good]["phase"] == "Draining" or None, 30, what="good draining"
    )
    drained = wait_for(
        lambda: r if (r := _replicas(shop, good)) == {"orchestrator": 1, "steps": 0} else None,
        30,
        what="the draining revision scaled to 1 orchestrator, 0 step workers",
    )
    assert drained
    assert _replicas(shop, bad) == {"orchestrator": 1, "steps": 1}
    draining_hash = _hash(shop, good)

    _patch(shop, {"env": [{"name": "GREETING", "value": "hi"}]})
    wait_for(
        lambda: _env(_pod_template(shop, bad)).get("GREETING") == "hi" or None,
        30,
        what="the latest revision rolled with the env change",
    )
    assert _hash(shop, good) == draining_hash, "a draining revision keeps its pod template"
    assert "GREETING" not in _env(_pod_template(shop, good))

    # The pinned run wakes with no step worker on its revision: its step's backlog starts one.
    resumed = shop.cli("hooks", "resume", "approve:good", "--payload", '{"approved": true}')
    assert resumed.returncode == 0, resumed.stderr
    done = shop.phase("on-good", "Completed", timeout=90)
    assert done["revision"] == good
    assert json.loads(done["output"]) == {"approved": True, "before": "shop:1", "after": "shop:1"}
    wait_for(
        lambda: _replicas(shop, good)["steps"] == 0 or None, 30, what="steps back to 0, drained"
    )

    shop.start("on-bad", "approval", {"order_id": "bad"})
    assert wait_for(lambda: shop.status("on-bad").get("waitingOn"), 60)
    assert shop.status("on-bad")["revision"] == bad
    count = shop.wfd()["status"]["revisionCount"]

    _patch(shop, {"image": "shop:1"})
    wait_for(lambda: shop.latest() == good or None, 60, what="the rollback to the good revision")
    status = shop.wfd()["status"]
    assert status["revisionCount"] == count, "a rollback reuses the revision: no new one"
    assert status["latestCreatedRevision"] == good
    phases = {r["id"]: r["phase"] for r in status["revisions"]}
    assert phases == {good: "Active", bad: "Draining"}
    wait_for(
        lambda: _replicas(shop, good) == {"orchestrator": 1, "steps": 1} or None,
        30,
        what="the reused revision back at full replicas",
    )
    wait_for(
        lambda: _env(_pod_template(shop, good)).get("GREETING") == "hi" or None,
        30,
        what="the reused revision on the current spec's env",
    )

    _patch(shop, {"revisions": {bad: {"action": "CancelRuns", "reason": "bad release"},
                                good: {"action": "CancelRuns"}}})  # fmt: skip
    cancelled = shop.phase("on-bad", "Cancelled", timeout=30)
    assert cancelled["revision"] == bad
    assert shop.world_run(cancelled["runId"])["status"] == "cancelled"
    wait_for(lambda: _revisions(shop)[bad]["phase"] == "Retired" or None, 60, what="bad retired")
    warnings = wait_for(
        lambda: (
            [
                e["message"]
                for e in shop.kube.rest.get(
                    f"/api/v1/namespaces/{shop.namespace}/events"
                    f"?fieldSelector=involvedObject.name={shop.deployment}"
                )["items"]
                if e["reason"] == "RevisionAction" and e["type"] == "Warning"
            ]
            or None
        ),
        30,
        what="the refusal on the latest revision",
    )
    assert any(f"revision {good} is Active and takes new runs" in w for w in warnings)
    held = shop.status("hold-good")
    assert (held["phase"], held["revision"]) == ("Running", good), "the latest's runs go on"
