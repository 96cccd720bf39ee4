"""The operator as GitOps tools and pipelines see it, with the real kubectl 1.20 (issue 11
items 1 and 2; review operator.md §2 (f)-(h), R4, R6, R8).

A rollout to a broken image reads Stalled, never rolled out; ``kubectl wait`` waits for a
run to succeed or fail; a WorkflowRun deleted (by its TTL, by hand) and applied again
adopts the run it had instead of starting another; deleting one while its World cannot be
reached keeps the finalizer until the cancel is recorded.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from .harness import wait_for
from .kubectl import kubectl
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

# No node has it: the process kubelet plays a failed pull (ErrImagePull), the real kubelet
# never pulls (imagePullPolicy Never: ErrImageNeverPull). Loopback only, either way.
BROKEN = "unpullable.invalid/shop:2"


def _k(shop: Shop, *args: str, timeout: float = 120, stdin: str | None = None) -> Any:
    return kubectl(shop.kube.kubeconfig, "-n", shop.namespace, *args, timeout=timeout, stdin=stdin)


def _apply(shop: Shop, name: str, workflow: str, input: Any, **spec: Any) -> None:
    manifest = {
        "apiVersion": "treadle.dev/v1alpha1", "kind": "WorkflowRun",
        "metadata": {"name": name},
        "spec": {"deployment": shop.deployment, "workflow": workflow, "input": input, **spec},
    }  # fmt: skip
    done = kubectl(
        shop.kube.kubeconfig, "-n", shop.namespace, "apply", "-f", "-",
        stdin=yaml.safe_dump(manifest),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions", [])}


def _runs(shop: Shop, workflow: str) -> list[dict[str, Any]]:
    listed = shop.cli("runs", "list", "--workflow", workflow, "--json")
    assert listed.returncode == 0, listed.stderr
    runs: list[dict[str, Any]] = json.loads(listed.stdout)
    return runs


def test_a_broken_image_after_a_good_one_is_stalled_and_never_reads_rolled_out(
    shop: Shop,
) -> None:
    """kstatus: Ready only when the current spec's revision serves; Stalled with the reason;
    observedGeneration on status and every condition; latestCreatedRevision beside
    latestRevision. `kubectl wait --for=condition=Ready` fails on the broken rollout and
    succeeds once it is fixed."""
    good = shop.latest()
    wfd = wait_for(
        lambda: (w := shop.wfd()) and _conditions(w).get("Ready", {}).get("status") == "True" and w
    )
    generation = wfd["metadata"]["generation"]
    assert wfd["status"]["latestCreatedRevision"] == good
    assert wfd["status"]["observedGeneration"] == generation
    assert {c["observedGeneration"] for c in wfd["status"]["conditions"]} == {generation}
    assert _conditions(wfd)["Stalled"]["status"] == "False"
    ready = _k(shop, "wait", "--for=condition=Ready", "wfd/shop", "--timeout=30s")
    assert ready.returncode == 0, ready.stderr

    shop.patch({"image": BROKEN}, "shop")
    broken_generation = shop.wfd()["metadata"]["generation"]
    assert broken_generation > generation
    seen: list[dict[str, Any]] = []

    def stalled() -> dict[str, Any] | None:
        obj = shop.wfd()
        status = obj.get("status") or {}
        conditions = _conditions(obj)
        seen.append(obj)
        if status.get("observedGeneration") == broken_generation:
            assert conditions["Ready"]["status"] == "False", f"a broken rollout read Ready: {obj}"
            assert status["latestCreatedRevision"] != status["latestRevision"]
        stall = conditions.get("Stalled", {})
        current = stall.get("observedGeneration") == broken_generation
        return obj if current and stall.get("status") == "True" else None

    obj = wait_for(stalled, 90, what="Stalled for the broken image")
    conditions = _conditions(obj)
    assert conditions["Stalled"]["reason"] == "ImagePull"
    message = conditions["Stalled"]["message"]
    assert any(reason in message for reason in shop.pods.image_pull_reasons), message
    assert BROKEN in conditions["Stalled"]["message"]
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", "ImagePull")
    assert conditions["Progressing"]["status"] == "False"
    assert obj["status"]["latestRevision"] == good, "the good revision still takes new runs"
    broken = obj["status"]["latestCreatedRevision"]
    assert broken != good
    assert {c["observedGeneration"] for c in obj["status"]["conditions"]} == {broken_generation}
    assert any(s["status"].get("observedGeneration") == broken_generation for s in seen)
    waited = _k(shop, "wait", "--for=condition=Ready", "wfd/shop", "--timeout=3s")
    assert waited.returncode != 0, "kubectl wait must not call a stalled rollout ready"
    shop.start("during", "greet", {"name": "still"})
    assert shop.phase("during", "Completed")["revision"] == good

    # shop:3 is in no scenario's TAGS: made on the real node as the rollout asks for it.
    shop.patch({"image": "shop:3"}, "shop")
    fixed = _k(shop, "wait", "--for=condition=Ready", "wfd/shop", "--timeout=90s", timeout=120)
    assert fixed.returncode == 0, fixed.stderr
    final = shop.wfd()
    assert final["status"]["latestRevision"] == final["status"]["latestCreatedRevision"]
    assert final["status"]["latestRevision"] not in (good, broken)
    assert _conditions(final)["Stalled"]["status"] == "False"


def test_kubectl_waits_for_a_run_to_succeed_or_fail_and_shows_its_columns_and_labels(
    shop: Shop,
) -> None:
    """`kubectl wait --for=condition=Succeeded` / `=Failed`; STARTED, DURATION and MESSAGE
    columns; `-l treadle.dev/phase=...`; waitingOn bounded to 20 with the count."""
    revision = shop.latest()
    _apply(shop, "hello", "greet", {"name": "kubectl"})
    _apply(shop, "nope", "refund", {"order_id": "x"})
    done = _k(shop, "wait", "--for=condition=Succeeded", "wfr/hello", "--timeout=60s")
    assert done.returncode == 0, done.stderr
    failed = _k(shop, "wait", "--for=condition=Failed", "wfr/nope", "--timeout=60s")
    assert failed.returncode == 0, failed.stderr
    hello = shop.run("hello")
    assert hello is not None
    conditions = _conditions(hello)
    assert (conditions["Succeeded"]["status"], conditions["Failed"]["status"]) == ("True", "False")
    assert hello["metadata"]["labels"] == {
        "treadle.dev/deployment": "shop", "treadle.dev/revision": revision,
        "treadle.dev/phase": "Completed",
    }  # fmt: skip
    nope = _conditions(shop.run("nope") or {})
    assert (nope["Failed"]["status"], nope["Failed"]["reason"]) == ("True", "UnknownWorkflow")
    assert "serves no workflow 'refund'" in nope["Failed"]["message"]

    table = _k(shop, "get", "wfr")
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    for column in ("STARTED", "DURATION", "MESSAGE", "PHASE"):
        assert column in header.split(), header
    row = next(r for r in rows if r.startswith("hello "))
    assert "Completed" in row and "completed in" in row
    assert "UnknownWorkflow" in next(r for r in rows if r.startswith("nope "))
    by_phase = _k(shop, "get", "wfr", "-l", "treadle.dev/phase=Completed", "-o", "name")
    assert by_phase.stdout.split() == ["workflowrun.treadle.dev/hello"]

    _apply(shop, "wide", "fanout", {"count": 25})
    wide = wait_for(
        lambda: (s := shop.status("wide")).get("waitingOnCount") == 25 and s, 60,
        what="25 open hooks counted",
    )  # fmt: skip
    assert len(wide["waitingOn"]) == 20
    assert wide["message"] == f"waiting on {wide['waitingOn'][0]} (+24 more)"
    assert shop.run("wide")["metadata"]["labels"]["treadle.dev/phase"] == "Running"  # type: ignore[index]
    running = _k(shop, "wait", "--for=condition=Succeeded", "wfr/wide", "--timeout=2s")
    assert running.returncode != 0, "a waiting run has not succeeded"


def test_a_run_its_ttl_deleted_and_applied_again_shows_the_completed_run_and_starts_none(
    shop: Shop,
) -> None:
    """GitOps self-heal after the TTL: the same manifest applied again adopts the finished
    run (status synced from it, condition Started/RunAdopted); the World has one run."""
    shop.latest()
    # The TTL must outlast the status poll's view of Completed on a loaded machine (at 2 s
    # the object was once deleted before the poll saw it); each wait below is on events.
    _apply(shop, "nightly", "greet", {"name": "once"}, ttlSecondsAfterFinished=8)
    first = shop.phase("nightly", "Completed")
    wait_for(lambda: shop.run("nightly") is None, 60, what="the TTL deletion")
    assert [r["run_id"] for r in _runs(shop, "greet")] == [first["runId"]]

    _apply(shop, "nightly", "greet", {"name": "once"}, ttlSecondsAfterFinished=8)
    again = shop.phase("nightly", "Completed")
    assert again["runId"] == first["runId"] and again["output"] == first["output"]
    started = _conditions({"status": again})["Started"]
    assert (started["status"], started["reason"]) == ("True", "RunAdopted")
    assert _conditions({"status": again})["Succeeded"]["status"] == "True"
    assert "Adopted" in shop.events("nightly")
    assert [r["run_id"] for r in _runs(shop, "greet")] == [first["runId"]], "nothing started"


def test_a_running_run_deleted_and_applied_again_is_adopted_and_a_new_run_key_starts_another(
    shop: Shop,
) -> None:
    """onDelete Orphan leaves the run going; applying the object again adopts it (same run
    id, its hook still open); another spec.runKey is another run."""
    shop.latest()
    _apply(shop, "order", "approval", {"order_id": "g1"}, onDelete="Orphan")
    waiting = wait_for(lambda: shop.status("order").get("waitingOn"), 60, what="the hook open")
    run_id = shop.status("order")["runId"]
    assert waiting == ["hook approve:g1"]
    gone = _k(shop, "delete", "wfr/order", "--timeout=60s")
    assert gone.returncode == 0, gone.stderr
    assert shop.world_run(run_id)["status"] in ("pending", "running"), "Orphan: not cancelled"
    assert "Orphaned" in shop.events("order")

    _apply(shop, "order", "approval", {"order_id": "g1"}, onDelete="Orphan")
    adopted = wait_for(
        lambda: (s := shop.status("order")).get("waitingOn") and s, 60, what="adopted, waiting"
    )
    assert adopted["runId"] == run_id and adopted["phase"] == "Running"
    resumed = shop.cli("hooks", "resume", "approve:g1", "--payload", '{"approved": true}')
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(shop.phase("order", "Completed")["output"])["approved"] is True
    assert [r["run_id"] for r in _runs(shop, "approval")] == [run_id]

    assert _k(shop, "delete", "wfr/order").returncode == 0
    wait_for(lambda: shop.run("order") is None, 30, what="the object gone")
    _apply(shop, "order", "approval", {"order_id": "g2"}, runKey="second")
    wait_for(lambda: shop.status("order").get("waitingOn"), 60, what="the new run waiting")
    second = shop.status("order")["runId"]
    assert second != run_id
    assert {r["run_id"] for r in _runs(shop, "approval")} == {run_id, second}


def _dead_url(live: str) -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"postgresql://treadle:x@127.0.0.1:{port}/{live.rsplit('/', 1)[-1]}"


def test_deleting_a_run_while_its_world_is_unreachable_keeps_the_finalizer_until_cancelled(
    shop: Shop, tmp_path: Path
) -> None:
    """Review R8: the World unreachable at delete time, the object stays (finalizer) with a
    CancelPending Warning and the run goes on; the World back, the cancel is recorded and
    the object goes."""
    shop.latest()
    shop.start("pending-cancel", "approval", {"order_id": "r8"})
    wait_for(lambda: shop.status("pending-cancel").get("waitingOn"), 60, what="the hook open")
    run_id = shop.status("pending-cancel")["runId"]
    secret = f"/api/v1/namespaces/{shop.namespace}/secrets/treadle-world"
    shop.kube.rest.patch(secret, {"stringData": {"database-url": _dead_url(shop.database_url)}})
    # Unreachable for the operator too before the delete: on a loaded machine its delete
    # handler once ran before it read the new Secret, and cancelled on the old connection.
    wait_for(
        lambda: _conditions(shop.wfd("shop")).get("WorldReachable", {}).get("status") == "False",
        60,
        what="the operator's WorldReachable=False",
    )

    shop.kube.rest.delete(shop.path("workflowruns", "pending-cancel"))
    wait_for(
        lambda: "CancelPending" in shop.events("pending-cancel"), 60, what="a CancelPending Event"
    )
    held = shop.run("pending-cancel")
    assert held is not None, "the finalizer keeps the object while the cancel is pending"
    assert held["metadata"]["deletionTimestamp"]
    assert "treadle.dev/finalizer" in held["metadata"]["finalizers"]
    assert shop.world_run(run_id)["status"] in ("pending", "running"), "nothing cancelled yet"

    shop.kube.rest.patch(secret, {"stringData": {"database-url": shop.database_url}})
    wait_for(lambda: shop.run("pending-cancel") is None, 60, what="the object gone")
    wait_for(lambda: shop.world_run(run_id)["status"] == "cancelled", 60, what="the run cancelled")


def test_unschedulable_workers_and_a_quota_refusing_pods_are_stalled_with_the_reason(
    shop_factory: Callable[[], Shop],
) -> None:
    """Stalled reasons from the scheduler (PodScheduled=False, Unschedulable) and from the
    ReplicaSet (a ResourceQuota refusing its pods: the Deployment's ReplicaFailure)."""
    shop = shop_factory()
    shop.secret()
    shop.operator.start()
    huge = {"replicas": 1, "resources": {"requests": {"cpu": "1000"}}}
    shop.deploy("huge", "shop:1", orchestrator=huge)

    def stalled(name: str) -> dict[str, Any] | None:
        found = _conditions(shop.wfd(name)).get("Stalled")
        return found if found and found["status"] == "True" else None

    unschedulable = wait_for(lambda: stalled("huge"), 90, what="Stalled: Unschedulable")
    assert unschedulable["reason"] == "Unschedulable"
    assert "Insufficient cpu" in unschedulable["message"], unschedulable
    assert _conditions(shop.wfd("huge"))["Ready"]["status"] == "False"

    shop.kube.rest.create(
        f"/api/v1/namespaces/{shop.namespace}/resourcequotas",
        {"metadata": {"name": "no-more-pods"}, "spec": {"hard": {"pods": "0"}}},
    )
    shop.deploy("quota", "shop:1")
    refused = wait_for(lambda: stalled("quota"), 90, what="Stalled: ReplicaFailure")
    assert refused["reason"] == "ReplicaFailure"
    assert "exceeded quota" in refused["message"], refused


def test_a_reapplied_name_naming_another_deployment_is_refused_the_run_it_finds(
    shop: Shop,
) -> None:
    """Adoption checks the binding (s5, review M6): the same namespace and name derive the
    same run id, but an object naming another WorkflowDeployment is not that run's owner;
    it ends Failed/RunNotOwned, shows nothing of the run, and starts nothing."""
    shop.latest()
    _apply(shop, "mine", "greet", {"name": "owner"})
    done = shop.phase("mine", "Completed")
    assert _k(shop, "delete", "wfr/mine").returncode == 0
    wait_for(lambda: shop.run("mine") is None, 30, what="the object gone")
    shop.deploy("other", "shop:1")
    shop.latest("other")

    manifest = {
        "apiVersion": "treadle.dev/v1alpha1", "kind": "WorkflowRun", "metadata": {"name": "mine"},
        "spec": {"deployment": "other", "workflow": "greet", "input": {"name": "thief"}},
    }  # fmt: skip
    applied = _k(shop, "apply", "-f", "-", stdin=yaml.safe_dump(manifest))
    assert applied.returncode == 0, applied.stderr
    refused = shop.phase("mine", "Failed")
    assert refused["reason"] == "RunNotOwned"
    assert f"run {done['runId']} was started for WorkflowRun" in refused["error"]["message"]
    assert not refused.get("runId") and not refused.get("output")
    assert _conditions({"status": refused})["Failed"]["reason"] == "RunNotOwned"
    assert [r["run_id"] for r in _runs(shop, "greet")] == [done["runId"]], "nothing started"
