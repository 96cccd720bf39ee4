"""World Secret rotation, ownerReferences and the users' roles, against a real kube-apiserver.

- R9: the World Secret's credentials are rotated (the test Postgres trusts every local
  connection, so "the password" is a role: the Secret moves from role A to role B and
  A then loses LOGIN, which is what revoking old credentials does). The operator
  replaces its World connection (no session of A is left: pool and LISTEN closed),
  keeps serving the status of a run it tracked before, and the worker Deployments roll
  on the Secret checksum; the new workers read the URLs from the mounted Secret files.
  A binary key the operator does not read is ignored; a URL key that is not text is a
  ``SecretUnreadable`` condition naming the key.
- R10: with ``OwnerReferencesPermissionEnforcement`` on (tests/k8s/cluster.py), a
  Deployment owned by a WorkflowDeployment with ``blockOwnerDeletion`` is refused to an
  account without ``update`` on ``workflowdeployments/finalizers`` and accepted for the
  operator's chart identity.
- Review section 1 (user-facing RBAC): the chart's view/edit ClusterRoles aggregate into
  the built-in ``edit`` and ``view``: an ``edit`` user creates a WorkflowRun, a ``view``
  user reads and may not write.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from ..postgres.pgserver import Server as PgServer
from .harness import Kube, wait_for
from .operator_env import CHART, Shop
from .rest import ApiError, Rest
from .test_operator import nats_server, operator_kubeconfig, pg_clones, pg_server, shop_factory

__all__ = ["nats_server", "operator_kubeconfig", "pg_clones", "pg_server", "shop_factory"]

CHECKSUM = "treadle.dev/world-secret-checksum"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
BINARY = base64.b64encode(b"\xff\xfe\x00 not text").decode()


def _sql(dsn: str, statement: str) -> Any:
    """One statement on a connection of its own (a loop of its own); its first value."""

    async def run() -> Any:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetchval(statement)
        finally:
            await conn.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, run()).result()


def _as_role(dsn: str, role: str, password: str) -> str:
    parts = urlsplit(dsn)
    netloc = f"{role}:{password}@{parts.hostname}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _world_secret(shop: Shop, database_url: str) -> dict[str, str]:
    return {
        "database-url": _b64(database_url),
        "nats-url": _b64(shop.nats_url),
        "keystore.p12": BINARY,  # a binary key nothing reads: never decoded
    }


def _workers(shop: Shop, revision: str) -> list[dict[str, Any]]:
    return shop.kube.pods(shop.namespace, f"treadle.dev/revision={revision}")  # type: ignore[return-value]


def _rolled_to(shop: Shop, revision: str, checksum: str) -> list[dict[str, Any]] | None:
    """The revision's two worker pods once both carry ``checksum`` and run (none older)."""
    pods = _workers(shop, revision)
    annotations = [(p["metadata"].get("annotations") or {}).get(CHECKSUM) for p in pods]
    running = [(p.get("status") or {}).get("phase") == "Running" for p in pods]
    if len(pods) == 2 and all(a == checksum for a in annotations) and all(running):
        return pods
    return None


def _sessions(admin_dsn: str, role: str) -> int:
    found = _sql(admin_dsn, f"SELECT count(*) FROM pg_stat_activity WHERE usename = '{role}'")
    return int(found)


def test_a_rotated_world_secret_replaces_the_connection_and_rolls_the_workers(
    shop_factory: Callable[[], Shop], pg_server: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R9: rotate the Secret's credentials; the operator serves status on the new ones,
    nothing keeps a session of the old role, and the workers roll onto the new Secret."""
    # Where the operator caches Secret reads (review R5 (c)), a rotation is seen this soon.
    monkeypatch.setenv("TREADLE_OPERATOR_SECRET_CACHE_SECONDS", "1")
    shop = shop_factory()
    admin = pg_server.dsn()
    tag = uuid.uuid4().hex[:8]
    old_role, new_role = f"rot_a_{tag}", f"rot_b_{tag}"
    for role in (old_role, new_role):
        _sql(admin, f"CREATE ROLE {role} LOGIN SUPERUSER")
    old_url = _as_role(shop.database_url, old_role, "password-1")
    new_url = _as_role(shop.database_url, new_role, "password-2")
    secrets = f"/api/v1/namespaces/{shop.namespace}/secrets"
    shop.kube.rest.create(
        secrets, {"metadata": {"name": "treadle-world"}, "data": _world_secret(shop, old_url)}
    )
    shop.operator.start()
    shop.deploy(shop.deployment, "shop:1")
    revision = shop.latest()
    deployments = f"/apis/apps/v1/namespaces/{shop.namespace}/deployments"
    template = shop.kube.rest.get(f"{deployments}/{revision}-steps")["spec"]["template"]
    first = template["metadata"]["annotations"][CHECKSUM]
    (container,) = template["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["TREADLE_DATABASE_URL_FILE"]["value"] == "/var/run/treadle/world/database-url"
    assert "TREADLE_DATABASE_URL" not in env and "TREADLE_NATS_URL" not in env
    old_pods = {p["metadata"]["uid"] for p in wait_for(lambda: _rolled_to(shop, revision, first))}
    assert _sessions(admin, old_role) > 0  # the operator and the workers use role A

    shop.start("before", "approval", {"order_id": "rot"})
    assert wait_for(lambda: shop.status("before").get("waitingOn"), 60, what="before waiting")

    # Rotate: the Secret names role B (new password); then role A may no longer log in.
    shop.kube.rest.patch(f"{secrets}/treadle-world", {"data": {"database-url": _b64(new_url)}})
    pods = wait_for(
        lambda: (
            (t := shop.kube.rest.get(f"{deployments}/{revision}-steps")["spec"]["template"])
            and (t["metadata"].get("annotations") or {}).get(CHECKSUM) != first
            and _rolled_to(shop, revision, t["metadata"]["annotations"][CHECKSUM])
        ),
        60,
        what="the worker pods rolled onto the rotated Secret",
    )
    assert not old_pods & {p["metadata"]["uid"] for p in pods}
    assert wait_for(
        lambda: _sessions(admin, old_role) == 0, 30, what=f"no session of {old_role} left"
    )
    _sql(admin, f"ALTER ROLE {old_role} NOLOGIN")
    assert _sessions(admin, new_role) > 0

    # The run tracked before the rotation: its status now comes through the new connection.
    shop.database_url = new_url
    resumed = shop.cli("hooks", "resume", "approve:rot", "--payload", '{"approved": true}')
    assert resumed.returncode == 0, resumed.stderr
    done = shop.phase("before", "Completed")
    assert json.loads(done["output"])["approved"] is True
    shop.start("after", "greet", {"name": "rotated"})
    assert json.loads(shop.phase("after", "Completed")["output"])["hello"] == "rotated"
    assert (
        "Secret shop-" in shop.operator.log() and "is replaced by a new one" in shop.operator.log()
    )

    # A URL key whose value is not text: a condition naming the key, never a crash loop.
    shop.kube.rest.patch(f"{secrets}/treadle-world", {"data": {"database-url": BINARY}})

    def unreadable() -> dict[str, Any] | None:
        conditions = (shop.wfd().get("status") or {}).get("conditions") or []
        found = [c for c in conditions if c["type"] == "WorldReachable"]
        return found[0] if found and found[0]["reason"] == "SecretUnreadable" else None

    condition = wait_for(unreadable, 30, what="WorldReachable SecretUnreadable")
    assert condition["status"] == "False"
    assert "key database-url is not UTF-8 text" in condition["message"]


def _account(kube: Kube, namespace: str, name: str) -> Rest:
    """A ServiceAccount of ``namespace`` and a client holding a token of it."""
    kube.rest.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}}
    )
    issued = kube.rest.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": 3600}},
    )  # fmt: skip
    return Rest(kube.server, issued["status"]["token"])


def _bind(kube: Kube, namespace: str, account: str, kind: str, role: str) -> None:
    kube.rest.create(
        f"{RBAC}/namespaces/{namespace}/rolebindings",
        {"metadata": {"name": f"{account}-{role}"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]},
    )  # fmt: skip


def _owned_deployment(name: str, owner: dict[str, Any]) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "ownerReferences": [{
            "apiVersion": "treadle.dev/v1alpha1", "kind": "WorkflowDeployment",
            "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True,
        }]},
        "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "c", "image": "x", "command": ["true"]}]},
        }},
    }  # fmt: skip


def test_block_owner_deletion_needs_the_finalizers_permission_the_chart_grants(
    kube: Kube, namespace: str, operator_kubeconfig: Path
) -> None:
    """R10: under OwnerReferencesPermissionEnforcement a worker-style Deployment is refused
    without update on workflowdeployments/finalizers, and made with the chart's RBAC."""
    owner = kube.rest.create(
        f"/apis/treadle.dev/v1alpha1/namespaces/{namespace}/workflowdeployments",
        {"apiVersion": "treadle.dev/v1alpha1", "kind": "WorkflowDeployment",
         "metadata": {"name": "owner"}, "spec": {"image": "i:1", "module": "m"}},
    )  # fmt: skip
    kube.rest.create(
        f"{RBAC}/namespaces/{namespace}/roles",
        {"metadata": {"name": "deployer"}, "rules": [
            {"apiGroups": ["apps"], "resources": ["deployments"],
             "verbs": ["get", "create", "delete"]},
            {"apiGroups": ["treadle.dev"], "resources": ["workflowdeployments"],
             "verbs": ["get", "update", "delete"]},
        ]},
    )  # fmt: skip
    no_finalizers = _account(kube, namespace, "deployer")
    _bind(kube, namespace, "deployer", "Role", "deployer")
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    with pytest.raises(ApiError) as refused:
        no_finalizers.create(path, _owned_deployment("refused", owner))
    assert refused.value.status == 403
    assert "cannot set blockOwnerDeletion" in refused.value.body

    config = json.loads(operator_kubeconfig.read_text())
    operator = Rest(kube.server, config["users"][0]["user"]["token"])
    made = operator.create(path, _owned_deployment("made", owner))
    assert made["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True


def _aggregated(kube: Kube, role: str, verb: str) -> bool:
    rules = kube.rest.get(f"{RBAC}/clusterroles/{role}").get("rules") or []
    return any(
        "treadle.dev" in r.get("apiGroups", [])
        and "workflowruns" in r.get("resources", [])
        and verb in r.get("verbs", [])
        for r in rules
    )


def test_edit_users_create_workflow_runs_and_view_users_only_read_them(
    kube: Kube, namespace: str, operator_kubeconfig: Path
) -> None:
    """Review section 1: the chart's user roles reach the built-in edit and view roles
    (clusterrole-aggregation controller), so bindings to those are all a team needs."""
    from ..chart.render import render_chart

    del operator_kubeconfig  # rendered the chart's ClusterRoles already; make sure here too
    for manifest in render_chart(CHART, {"crds": {"install": False}}):
        labels = manifest.body["metadata"].get("labels") or {}
        if manifest.kind == "ClusterRole" and any("aggregate-to-" in k for k in labels):
            try:
                kube.rest.create(f"{RBAC}/clusterroles", manifest.body)
            except ApiError as exc:
                if exc.status != 409:
                    raise
    wait_for(lambda: _aggregated(kube, "edit", "create"), 30, what="edit aggregates treadle-edit")
    wait_for(lambda: _aggregated(kube, "view", "list"), 30, what="view aggregates treadle-view")
    assert not _aggregated(kube, "view", "create")

    editor, viewer = _account(kube, namespace, "alice"), _account(kube, namespace, "bob")
    _bind(kube, namespace, "alice", "ClusterRole", "edit")
    _bind(kube, namespace, "bob", "ClusterRole", "view")
    runs = f"/apis/treadle.dev/v1alpha1/namespaces/{namespace}/workflowruns"
    body = {
        "apiVersion": "treadle.dev/v1alpha1", "kind": "WorkflowRun",
        "metadata": {"name": "by-alice"},
        "spec": {"deployment": "shop", "workflow": "greet", "input": {"name": "a"}},
    }  # fmt: skip
    made = editor.create(runs, body)
    assert made["metadata"]["name"] == "by-alice"
    assert [i["metadata"]["name"] for i in viewer.get(runs)["items"]] == ["by-alice"]
    assert viewer.get(f"{runs}/by-alice")["spec"]["workflow"] == "greet"
    for attempt in (
        lambda: viewer.create(runs, {**body, "metadata": {"name": "by-bob"}}),
        lambda: viewer.patch(f"{runs}/by-alice", {"spec": {"cancel": True}}),
        lambda: viewer.delete(f"{runs}/by-alice"),
        lambda: editor.patch(f"{runs}/by-alice/status", {"status": {"phase": "Completed"}}),
    ):
        with pytest.raises(ApiError) as refused:
            attempt()
        assert refused.value.status == 403
    editor.delete(f"{runs}/by-alice")
    assert viewer.find(f"{runs}/by-alice") is None
