"""The operator grants no more than it must, against a real kube-apiserver (security review).

- M6: a WorkflowRun with a forged ``treadle.dev/mirrored-run`` annotation naming
  another namespace's run (both namespaces on one World) neither adopts it nor,
  when deleted, cancels it; nor does one naming a code-started run of another
  deployment.
- M5: an operator holding only the chart's namespaced Role (``rbac.scope:
  namespace``, the real RBAC authorizer) reconciles a WorkflowDeployment and a
  WorkflowRun in its namespace and can read no Secret elsewhere, nor an unnamed
  one at home; worker pods are created restricted; a ``spec.env`` setting an
  operator variable is refused with a condition naming it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .harness import Kube, wait_for
from .operator_env import CHART, Shop, chart_identity
from .rest import ApiError, Rest
from .test_operator import (
    _start_from_code,
    nats_server,
    operator_kubeconfig,
    pg_clones,
    pg_server,
    shop_factory,
)

__all__ = ["nats_server", "operator_kubeconfig", "pg_clones", "pg_server", "shop_factory"]

_other = itertools.count(1)
MIRRORED = "treadle.dev/mirrored-run"


def _namespace(kube: Kube, stem: str) -> str:
    name = f"{stem}-{next(_other)}"
    kube.rest.create("/api/v1/namespaces", {"metadata": {"name": name}})
    return name


def _wfr(shop: Shop, namespace: str, name: str, deployment: str, run_id: str) -> None:
    body = {
        "apiVersion": "treadle.dev/v1alpha1", "kind": "WorkflowRun",
        "metadata": {"name": name, "annotations": {MIRRORED: run_id}},
        "spec": {"deployment": deployment, "workflow": "greet", "input": {"name": "x"}},
    }  # fmt: skip
    shop.kube.rest.create(f"/apis/treadle.dev/v1alpha1/namespaces/{namespace}/workflowruns", body)


def _status(shop: Shop, namespace: str, name: str) -> dict[str, Any]:
    path = f"/apis/treadle.dev/v1alpha1/namespaces/{namespace}/workflowruns/{name}"
    found = shop.kube.rest.find(path) or {}
    status: dict[str, Any] = found.get("status") or {}
    return status


def _refused(shop: Shop, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = wait_for(
        lambda: (s := _status(shop, namespace, name)).get("phase") == "Failed" and s,
        60,
        what=f"WorkflowRun {namespace}/{name} refused",
    )
    return status


def test_a_forged_mirrored_run_annotation_neither_adopts_nor_cancels_a_foreign_run(
    shop_factory: Callable[[], Shop], kube: Kube
) -> None:
    """M6: team-b names team-a's run (one World): refused, and deleting it cancels nothing."""
    shop = shop_factory()
    other = _namespace(kube, "team-b")
    shop.operator.also = (other,)
    shop.secret()
    shop.secret(namespace=other)  # the same World, as a shared Secret copied around
    shop.operator.start()
    shop.deploy("shop", "shop:1")
    revision = shop.latest()
    evil = {"apiVersion": "treadle.dev/v1alpha1", "kind": "WorkflowDeployment",
            "metadata": {"name": "evil"},
            "spec": {"image": "evil:1", "module": "evil", "orchestrator": {"replicas": 0},
                     "steps": {"replicas": 0}}}  # fmt: skip
    kube.rest.create(f"/apis/treadle.dev/v1alpha1/namespaces/{other}/workflowdeployments", evil)

    shop.start("victim", "approval", {"order_id": "o-1"})
    victim = shop.phase("victim", "Running")["runId"]
    coded = _start_from_code(shop, revision, "from-code")

    _wfr(shop, other, "thief", "evil", victim)
    _wfr(shop, shop.namespace, "thief-at-home", "shop", victim)
    _wfr(shop, other, "thief-of-code", "evil", coded)
    for namespace, name in ((other, "thief"), (shop.namespace, "thief-at-home")):
        status = _refused(shop, namespace, name)
        assert status["reason"] == "RunNotOwned"
        assert "runId" not in status and status.get("mirrored") is not True
        assert status["error"]["message"].startswith(
            f"run {victim} was started for WorkflowRun {shop.namespace}/victim"
        )
        assert "approved" not in json.dumps(status)  # nothing of the victim's run is shown
    status = _refused(shop, other, "thief-of-code")
    assert (
        f"{revision}, which is not a revision of WorkflowDeployment {other}/evil"
        in (status["error"]["message"])
    )

    for namespace, name in ((other, "thief"), (shop.namespace, "thief-at-home")):
        path = f"/apis/treadle.dev/v1alpha1/namespaces/{namespace}/workflowruns/{name}"
        kube.rest.delete(path)
        # The finalizer goes once the delete handler ran: then the object is gone.
        wait_for(lambda p=path: kube.rest.find(p) is None, 60, what=f"{name} deleted")  # type: ignore[misc]
    assert shop.world_run(victim)["status"] == "running"
    assert shop.status("victim")["phase"] == "Running"
    events = kube.rest.get(f"/api/v1/namespaces/{other}/events")["items"]
    assert "RunNotOwned" in {e["reason"] for e in events}
    assert "Cancelling" not in {e["reason"] for e in events}

    # The victim's own object still owns it: deleting that one cancels it.
    shop.kube.rest.delete(shop.path("workflowruns", "victim"))
    wait_for(lambda: shop.world_run(victim)["status"] == "cancelled", 60, what="cancelled")


def _token(kubeconfig: Path) -> str:
    return str(json.loads(kubeconfig.read_text())["users"][0]["user"]["token"])


def _forbidden(rest: Rest, path: str) -> None:
    with pytest.raises(ApiError) as refused:
        rest.get(path)
    assert refused.value.status == 403, refused.value


def test_a_namespaced_operator_works_at_home_and_reads_no_secret_elsewhere(
    shop_factory: Callable[[], Shop], kube: Kube, tmp_path: Path
) -> None:
    """M5: rbac.scope namespace: the Role in the shop's namespace is enough, and nothing more."""
    shop = shop_factory()
    elsewhere = _namespace(kube, "elsewhere")
    shop.secret(namespace=elsewhere)
    shop.secret("unrelated")
    values = {"rbac": {"scope": "namespace", "namespaces": [shop.namespace]}}
    # The chart's operator Deployment serves exactly those namespaces, as the process here.
    from ..chart.render import render_chart

    (operator,) = [m.body for m in render_chart(CHART, values) if m.kind == "Deployment"]
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == ["operator", "--namespace", shop.namespace]
    shop.operator.kubeconfig = chart_identity(
        kube, tmp_path, values, release_ns=f"treadle-ns-{shop.namespace}"
    )
    shop.secret()
    shop.operator.start()
    shop.deploy("shop", "shop:1")
    revision = shop.latest()
    shop.start("hello", "greet", {"name": "scoped"})
    assert json.loads(shop.phase("hello", "Completed")["output"])["hello"] == "scoped"

    pods = f"/apis/apps/v1/namespaces/{shop.namespace}/deployments/{revision}-orchestrator"
    template = kube.rest.get(pods)["spec"]["template"]["spec"]
    assert template["securityContext"]["runAsNonRoot"] is True
    assert template["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert template["automountServiceAccountToken"] is False
    (container,) = template["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}

    # A deployment naming a Secret the Role does not list: a condition that says so.
    shop.deploy("unlisted", "shop:1", world={"secretName": "unrelated"})

    def forbidden() -> dict[str, str] | None:
        conditions = (shop.wfd("unlisted").get("status") or {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == "WorldReachable"), None)

    reachable = wait_for(forbidden, 30, what="a WorldReachable condition")
    assert (reachable["status"], reachable["reason"]) == ("False", "SecretForbidden")
    assert "may not read Secret" in reachable["message"]
    assert "worldSecretNames" in reachable["message"]

    # The real RBAC authorizer, as the operator's own account.
    rest = Rest(kube.server, _token(shop.operator.kubeconfig))
    rest.get(f"/api/v1/namespaces/{shop.namespace}/secrets/treadle-world")
    _forbidden(rest, f"/api/v1/namespaces/{elsewhere}/secrets/treadle-world")
    _forbidden(rest, f"/api/v1/namespaces/{shop.namespace}/secrets/unrelated")
    _forbidden(rest, f"/api/v1/namespaces/{shop.namespace}/secrets")
    _forbidden(rest, "/apis/apps/v1/deployments")
    _forbidden(rest, f"/apis/apps/v1/namespaces/{elsewhere}/deployments")
    _forbidden(rest, "/api/v1/namespaces")


def test_env_setting_an_operator_variable_is_refused_and_nothing_is_deployed(
    shop_factory: Callable[[], Shop], kube: Kube
) -> None:
    """M5: spec.env with TREADLE_DEPLOYMENT_ID: SpecAccepted False naming it, no workers."""
    shop = shop_factory()
    shop.secret()
    shop.operator.start()
    env = [{"name": "TREADLE_DEPLOYMENT_ID", "value": "other-team-rev-abc123"}]
    shop.deploy("sneaky", "shop:1", env=env)

    def refused() -> dict[str, str] | None:
        conditions = (shop.wfd("sneaky").get("status") or {}).get("conditions", [])
        found = [c for c in conditions if c["type"] == "SpecAccepted" and c["status"] == "False"]
        return found[0] if found else None

    condition = wait_for(refused, 30, what="SpecAccepted False")
    assert condition["reason"] == "ReservedEnv"
    assert condition["message"].startswith("spec.env[0] sets TREADLE_DEPLOYMENT_ID")
    assert "SpecRefused" in shop.events("sneaky")
    deployments = kube.rest.get(
        f"/apis/apps/v1/namespaces/{shop.namespace}/deployments"
        "?labelSelector=treadle.dev/deployment=sneaky"
    )
    assert deployments["items"] == []
    assert not (shop.wfd("sneaky").get("status") or {}).get("revisions")
