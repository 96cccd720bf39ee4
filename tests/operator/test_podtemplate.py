"""spec.template merged under what the operator owns (issue 11 item 4; review operator.md §1
"Pod template passthrough", §2 items 2 and 3), and the pinning rules of item 5 that are pure
(draining replicas, rollback reusing a live revision)."""

from __future__ import annotations

from typing import Any

from treadle_operator import manifests, pinned, podtemplate, revisions
from treadle_operator.models import (
    RevisionStatus,
    WorkflowDeploymentSpec,
    WorkflowDeploymentStatus,
)
from treadle_operator.revisions import Observed

TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "shop"}, "annotations": {"prometheus.io/scrape": "true"}},
    "spec": {
        "imagePullSecrets": [{"name": "registry"}],
        "nodeSelector": {"pool": "workers"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "treadle"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
        "priorityClassName": "batch",
        "hostNetwork": False,
        "securityContext": {"runAsUser": 10001, "fsGroup": 2000},
        "volumes": [{"name": "cache", "emptyDir": {}}],
        "containers": [
            {"name": "worker",
             "env": [{"name": "FEATURE", "value": "on"}],
             "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
             "readinessProbe": {"exec": {"command": ["true"]}},
             "resources": {"requests": {"cpu": "100m"}},
             "securityContext": {"capabilities": {"drop": ["NET_RAW"]}}},
            {"name": "proxy", "image": "proxy:1"},
        ],
    },
}  # fmt: skip


def _spec(template: dict[str, Any] | None = TEMPLATE, **more: Any) -> WorkflowDeploymentSpec:
    body: dict[str, Any] = {"image": "img:1", "module": "orders.app", **more}
    if template is not None:
        body["template"] = template
    return WorkflowDeploymentSpec.model_validate(body)


def _pod(spec: WorkflowDeploymentSpec, role: manifests.Role = "steps") -> dict[str, Any]:
    made = manifests.worker_deployment(
        owner="orders", owner_uid="u", namespace="ns", revision="orders-abc123",
        image="img:1", module="orders.app", spec=spec, role=role, replicas=1,
    )  # fmt: skip
    template: dict[str, Any] = made["spec"]["template"]
    return template


def _with(path: str, value: Any) -> dict[str, Any]:
    """TEMPLATE with ``value`` at ``path`` (dots; an int is a list index)."""
    import copy

    changed = copy.deepcopy(TEMPLATE)
    node: Any = changed
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    return changed


def test_the_template_passes_through_and_the_operator_keeps_what_it_owns() -> None:
    pod = _pod(_spec())
    spec = pod["spec"]
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["nodeSelector"] == {"pool": "workers"}
    assert spec["tolerations"][0]["key"] == "dedicated"
    assert spec["affinity"] == TEMPLATE["spec"]["affinity"]
    assert spec["priorityClassName"] == "batch"
    assert pod["metadata"]["labels"]["team"] == "shop"
    assert pod["metadata"]["labels"]["treadle.dev/revision"] == "orders-abc123"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    # the template's volumes beside the operator's own (the World Secret's files)
    assert {v["name"] for v in spec["volumes"]} == {"tmp", "cache", "treadle-world-files"}
    worker, proxy = spec["containers"]
    assert worker["name"] == "worker" and worker["image"] == "img:1"
    assert worker["command"] == ["treadle"]
    assert worker["args"][:4] == ["worker", "orders.app", "--role", "steps"]
    env = [e["name"] for e in worker["env"]]
    assert env[0] == "TREADLE_WORLD" and "FEATURE" in env and "TREADLE_DEPLOYMENT_ID" in env
    assert {m["mountPath"] for m in worker["volumeMounts"]} == {
        "/tmp",
        "/cache",
        "/var/run/treadle/world",
    }
    assert worker["readinessProbe"] == {"exec": {"command": ["true"]}}
    assert worker["resources"] == {"requests": {"cpu": "100m"}}
    # Tightened, never weakened: the restricted defaults stay, the template's drop is added.
    assert worker["securityContext"]["readOnlyRootFilesystem"] is True
    assert worker["securityContext"]["capabilities"]["drop"] == ["ALL", "NET_RAW"]
    assert spec["securityContext"] == {
        "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"},
        "runAsUser": 10001, "fsGroup": 2000,
    }  # fmt: skip
    # A sidecar gets the restricted container defaults under its own.
    assert proxy["image"] == "proxy:1"
    assert proxy["securityContext"]["allowPrivilegeEscalation"] is False
    assert spec["automountServiceAccountToken"] is False
    assert manifests.template_refusal(_spec()) is None


def test_role_resources_and_pull_policy_beat_the_templates() -> None:
    spec = _spec(
        orchestrator={"resources": {"limits": {"memory": "1Gi"}}}, imagePullPolicy="Always"
    )
    orchestrator = _pod(spec, "orchestrator")["spec"]["containers"][0]
    assert orchestrator["resources"] == {"limits": {"memory": "1Gi"}}
    assert orchestrator["imagePullPolicy"] == "Always"
    assert _pod(spec, "steps")["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "100m"}
    }


def test_no_template_changes_nothing_but_the_hash() -> None:
    pod = _pod(_spec(None))
    assert [c["name"] for c in pod["spec"]["containers"]] == ["worker"]
    assert set(pod["metadata"]["annotations"]) == {podtemplate.HASH_ANNOTATION}
    assert "nodeSelector" not in pod["spec"]


def test_every_change_of_env_resources_or_template_changes_the_hash() -> None:
    """Review §2 item 3 (drift): the hash annotation is what makes ensure_deployment roll."""
    base = podtemplate.template_hash(_pod(_spec()))
    assert base == _pod(_spec())["metadata"]["annotations"][podtemplate.HASH_ANNOTATION]
    assert base == podtemplate.template_hash(_pod(_spec()))  # stable
    changed = [
        _spec(env=[{"name": "X", "value": "1"}]),
        _spec(steps={"resources": {"requests": {"cpu": "1"}}}),
        _spec(_with("spec.nodeSelector", {"pool": "other"})),
        _spec(_with("metadata.labels", {"team": "other"})),
        _spec(_with("spec.containers.0.env", [{"name": "FEATURE", "value": "off"}])),
        _spec(serviceAccountName="orders"),
    ]
    hashes = {podtemplate.template_hash(_pod(s)) for s in changed}
    assert base not in hashes and len(hashes) == len(changed)


def test_what_the_operator_owns_is_refused_with_the_field_named() -> None:
    cases = {
        "spec.containers.0.image": ("other:1", "containers[0] (worker) sets image"),
        "spec.containers.0.command": (["sh"], "sets command"),
        "spec.containers.0.args": (["x"], "sets args"),
        "spec.containers.0.env": ([{"name": "TREADLE_DEPLOYMENT_ID", "value": "x"}],
                                  "containers[0].env[0] sets TREADLE_DEPLOYMENT_ID"),
        "metadata.labels": ({"treadle.dev/revision": "x"}, "metadata.labels[treadle.dev/revision]"),
        "metadata.annotations": ({"treadle.dev/template-hash": "x"}, "metadata.annotations"),
        "spec.volumes": ([{"name": "tmp", "emptyDir": {}}], "spec.volumes[0] is named tmp"),
        "spec.containers.0.volumeMounts": ([{"name": "cache", "mountPath": "/tmp"}],
                                           "volumeMounts[0] mounts at /tmp"),
        "spec.containers.1.name": ("worker", "spec.template.spec.containers[1]: a second entry"),
    }  # fmt: skip
    for path, (value, expected) in cases.items():
        problem = manifests.template_refusal(_spec(_with(path, value)))
        assert problem is not None and expected in problem, (path, problem)
    label = manifests.template_refusal(
        _spec(_with("metadata.labels", {"app.kubernetes.io/name": "x"}))
    )
    assert label is not None and "set by the operator" in label


def test_a_template_may_tighten_the_security_context_but_not_weaken_it() -> None:
    weak = {
        "spec.securityContext": {"runAsNonRoot": False},
        "spec.securityContext.runAsUser": 0,
        "spec.containers.0.securityContext": {"privileged": True},
        "spec.containers.0.securityContext.allowPrivilegeEscalation": True,
        "spec.containers.0.securityContext.readOnlyRootFilesystem": False,
        "spec.containers.0.securityContext.capabilities": {"add": ["SYS_ADMIN"]},
        "spec.containers.0.securityContext.seccompProfile": {"type": "Unconfined"},
    }
    for path, value in weak.items():
        problem = manifests.template_refusal(_spec(_with(path, value)))
        assert problem is not None and "only tighten" in problem, (path, problem)
        assert "spec.podSecurityContext" in problem or "spec.containerSecurityContext" in problem
    fine = _with("spec.containers.0.securityContext.capabilities", {"add": ["NET_BIND_SERVICE"]})
    assert manifests.template_refusal(_spec(fine)) is None
    # Even merged (refusal aside), the operator's value stays where the template says nothing.
    tight = _with("spec.containers.0.securityContext", {"runAsUser": 20000})
    worker = _pod(_spec(tight))["spec"]["containers"][0]
    assert worker["securityContext"]["runAsUser"] == 20000
    assert worker["securityContext"]["allowPrivilegeEscalation"] is False


def test_a_service_account_token_needs_a_named_service_account() -> None:
    no_account = _with("spec.automountServiceAccountToken", True)
    problem = manifests.template_refusal(_spec(no_account))
    assert problem is not None and "automountServiceAccountToken" in problem
    named = _with("spec.serviceAccountName", "orders")
    pod = _pod(_spec(named))["spec"]
    assert pod["serviceAccountName"] == "orders" and "automountServiceAccountToken" not in pod
    both = _pod(_spec(named, serviceAccountName="billing"))["spec"]
    assert both["serviceAccountName"] == "billing"


def test_a_removed_template_key_leaves_the_merged_template() -> None:
    """The merge builds the whole template (kube replaces it), so a dropped key goes."""
    dropped = _with("spec.nodeSelector", {})
    assert _pod(_spec(dropped))["spec"]["nodeSelector"] == {}
    without = {k: v for k, v in TEMPLATE["spec"].items() if k != "nodeSelector"}
    assert "nodeSelector" not in _pod(_spec({"spec": without}))["spec"]


# -- item 5: draining replicas and rollback ---------------------------------------------


def test_a_draining_revision_keeps_one_orchestrator_and_scales_steps_from_zero() -> None:
    spec = _spec(None, orchestrator={"replicas": 3}, steps={"replicas": 4})
    assert pinned.draining_bounds(spec, "orchestrator") == (1, 3, 100)
    assert pinned.draining_bounds(spec, "steps") == (0, 4, 100)
    assert pinned.scaled(0, 0, 4, 100) == 0
    assert pinned.scaled(1, 0, 4, 100) == 1  # any backlog wakes one step worker
    assert pinned.scaled(250, 0, 4, 100) == 3
    assert pinned.scaled(10_000, 0, 4, 100) == 4
    custom = _spec(None, draining={"orchestrator": {"replicas": 0, "maxReplicas": 1},
                                   "steps": {"replicas": 1, "maxReplicas": 2,
                                             "pendingPerReplica": 10}})  # fmt: skip
    assert pinned.draining_bounds(custom, "orchestrator") == (0, 1, 100)
    assert pinned.draining_bounds(custom, "steps") == (1, 2, 10)
    autoscaled = _spec(None, steps={"replicas": 1, "autoscale": {"maxReplicas": 9}})
    assert pinned.draining_bounds(autoscaled, "steps") == (0, 9, 100)


def test_only_revisions_that_take_new_runs_follow_the_spec() -> None:
    def rev(phase: str) -> RevisionStatus:
        return RevisionStatus(id="r", image="i", module="m", created_at="t", phase=phase)  # type: ignore[arg-type]

    assert [pinned.rolls(rev(p)) for p in ("Pending", "Active", "Draining")] == [
        True, True, False,
    ]  # fmt: skip


def _plan(
    image: str, status: WorkflowDeploymentStatus, observed: dict[str, Observed]
) -> revisions.Plan:
    return revisions.plan(
        namespace="ns", name="orders", uid="u-1", generation=1,
        spec=WorkflowDeploymentSpec.model_validate(
            {"image": image, "module": "m", "retireAfterSeconds": 0}
        ),
        status=status, observed=observed, now="2026-12-01T00:00:00Z",
    )  # fmt: skip


def test_rolling_back_to_a_draining_image_reuses_its_revision() -> None:
    """Review §1 "Rollback": the previous image back is the previous revision, same id, at
    once (it is ready), and the bad one drains; a retired one is not reused."""
    first = _plan("img:1", WorkflowDeploymentStatus(), {})
    good = first.created
    assert good is not None
    ready = _plan("img:1", first.status, {good: Observed(ready=True)})
    second = _plan("img:2", ready.status, {good: Observed(ready=True, active_runs=2)})
    bad = second.created
    assert bad is not None
    rolled = _plan("img:2", second.status, {good: Observed(ready=True, active_runs=2),
                                            bad: Observed(ready=True)})  # fmt: skip
    assert rolled.status.latest_revision == bad
    phases = {r.id: r.phase for r in rolled.status.revisions}
    assert phases == {good: "Draining", bad: "Active"}

    back = _plan("img:1", rolled.status, {good: Observed(ready=True, active_runs=2),
                                          bad: Observed(ready=True, active_runs=1)})  # fmt: skip
    assert back.created is None
    assert back.status.revision_count == rolled.status.revision_count
    assert back.status.latest_revision == good
    assert [(r.id, r.phase) for r in back.status.revisions] == [(bad, "Draining"), (good, "Active")]
    assert any("reused" in c for c in back.changes)
    reused = next(r for r in back.status.revisions if r.id == good)
    assert reused.superseded_at is None, "latest again: its retire delay starts anew"

    # Once drained and retired, the same image is a new revision (the World cannot un-retire).
    drained = _plan("img:1", back.status, {good: Observed(ready=True), bad: Observed(ready=True)})
    assert {r.id: r.phase for r in drained.status.revisions}[bad] == "Retired"
    again = _plan("img:2", drained.status, {good: Observed(ready=True)})
    assert again.created is not None and again.created not in (good, bad)


def test_cancel_runs_ends_a_draining_revisions_runs_and_is_refused_once_on_the_latest() -> None:
    """Item 5 (review §1 "Moving pinned runs"): CancelRuns on a Draining revision cancels
    every run of it that has not ended, on the World contract (here the memory World); on
    the Active one it cancels nothing and is reported once, not on every reconcile."""
    import asyncio

    from treadle.testing.memory import MemoryBackend, MemoryWorld

    async def scenario() -> None:
        world = await MemoryWorld(MemoryBackend()).open()
        try:
            made = {
                rev: [
                    (await world.runs.create(
                        workflow_name="w", input=None, deployment_id=rev, spec_version=9
                    )).run_id
                    for _ in range(count)
                ]
                for rev, count in (("bad", 2), ("good", 1))
            }  # fmt: skip
            status = WorkflowDeploymentStatus(
                latest_revision="good",
                revisions=[
                    RevisionStatus(id="bad", image="i:2", module="m", created_at="t",
                                   phase="Draining"),
                    RevisionStatus(id="good", image="i:1", module="m", created_at="t",
                                   phase="Active"),
                ],
            )  # fmt: skip
            spec = _spec(None, revisions={"bad": {"action": "CancelRuns", "reason": "bad"},
                                          "good": {"action": "CancelRuns"},
                                          "gone": {"action": "CancelRuns"}})  # fmt: skip
            notes = await pinned.act(world, spec, status, namespace="ns", name="unit")
            assert notes[0] == ("revision bad: 2 pinned run(s) cancelled (bad)", False)
            assert len(notes) == 2 and notes[1][1] is True
            assert "revision good is Active and takes new runs" in notes[1][0]
            for run_id in made["bad"]:
                assert (await world.runs.get(run_id)).status == "cancelled"
            assert (await world.runs.get(made["good"][0])).status == "pending"
            again = await pinned.act(world, spec, status, namespace="ns", name="unit")
            assert again == [], "nothing left to cancel, and the refusal was reported"
        finally:
            pinned.forget("ns", "unit")
            await world.close()

    asyncio.run(scenario())


def test_a_draining_revision_follows_only_the_operators_own_pod_annotations() -> None:
    """Its template stays (no hash followed), but an operator annotation such as a World
    Secret checksum is followed, so a rotated Secret reaches pinned runs' workers too."""
    made = manifests.worker_deployment(
        owner="orders", owner_uid="u", namespace="ns", revision="orders-abc123",
        image="img:1", module="orders.app", spec=_spec(), role="steps", replicas=0,
    )  # fmt: skip
    annotations = made["spec"]["template"]["metadata"]["annotations"]
    assert pinned.followed(made) == {}
    annotations["treadle.dev/world-checksum"] = "abc"
    assert pinned.followed(made) == {"treadle.dev/world-checksum": "abc"}
