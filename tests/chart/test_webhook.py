"""The chart's admission webhook objects (docs/operator-admission.md): the Service, the
ValidatingWebhookConfiguration the operator patches its CA into, and the RBAC for exactly
those two objects (``treadle_operator.permissions.webhook_*_rules``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from treadle_operator import permissions, webhook, webhookcerts

from . import render

CHART = Path(__file__).resolve().parents[2] / "charts" / "treadle"


def _objects(overrides: dict[str, Any] | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (m.kind, m.body["metadata"]["name"]): m.body for m in render.render_chart(CHART, overrides)
    }


def _env(objects: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    (container,) = objects["Deployment", "treadle-operator"]["spec"]["template"]["spec"][
        "containers"
    ]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _rules(body: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(body["rules"], key=lambda r: (r["resources"], r["verbs"]))


def test_the_default_install_serves_the_webhook_for_workflowruns_fail_closed() -> None:
    objects = _objects()
    config = objects["ValidatingWebhookConfiguration", "treadle-webhook"]
    (hook,) = config["webhooks"]
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
    assert hook["timeoutSeconds"] == 5
    assert hook["rules"] == [
        {"apiGroups": ["treadle.dev"], "apiVersions": ["v1alpha1"], "resources": ["workflowruns"],
         "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}
    ]  # fmt: skip
    assert hook["clientConfig"] == {"service": {
        "name": "treadle-webhook", "namespace": "treadle-system",
        "path": webhook.PATH, "port": 443}}  # fmt: skip
    assert "caBundle" not in hook["clientConfig"], "the operator patches it in"
    assert "namespaceSelector" not in hook
    service = objects["Service", "treadle-webhook"]
    assert service["spec"]["ports"] == [
        {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    deployment = objects["Deployment", "treadle-operator"]
    assert service["spec"]["selector"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in container["ports"]
    env = _env(objects)
    assert env["TREADLE_OPERATOR_WEBHOOK"] == "true"
    assert env["TREADLE_OPERATOR_WEBHOOK_PORT"] == "9443"
    assert env["TREADLE_OPERATOR_WEBHOOK_CONFIG"] == "treadle-webhook"
    assert env["TREADLE_OPERATOR_WEBHOOK_SECRET"] == "treadle-webhook-tls"
    assert env["TREADLE_OPERATOR_WEBHOOK_NAMESPACE"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }
    hosts = webhookcerts.parse_hosts(env["TREADLE_OPERATOR_WEBHOOK_HOSTS"])
    assert "treadle-webhook.treadle-system.svc" in hosts  # the name the API server dials


def test_the_webhook_rbac_is_its_configuration_and_its_secret_by_name() -> None:
    objects = _objects()
    cluster = objects["ClusterRole", "treadle-webhook"]
    role = objects["Role", "treadle-webhook"]
    assert role["metadata"]["namespace"] == "treadle-system"
    expected_cluster = [
        r.as_manifest() for r in permissions.webhook_cluster_rules("treadle-webhook")
    ]
    expected_ns = [
        r.as_manifest() for r in permissions.webhook_namespace_rules("treadle-webhook-tls")
    ]
    assert _rules(cluster) == _rules({"rules": expected_cluster})
    assert _rules(role) == _rules({"rules": expected_ns})
    for binding, kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        body = objects[binding, "treadle-webhook"]
        assert body["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": "treadle-webhook"
        }  # fmt: skip
        assert body["subjects"] == [
            {"kind": "ServiceAccount", "name": "treadle", "namespace": "treadle-system"}
        ]


def test_values_set_the_policy_the_namespaces_and_turn_it_off() -> None:
    selector = {"matchLabels": {"treadle.dev/webhook": "on"}}
    objects = _objects({"webhook": {"failurePolicy": "Ignore", "timeoutSeconds": 3,
                                    "port": 10443, "namespaceSelector": selector}})  # fmt: skip
    (hook,) = objects["ValidatingWebhookConfiguration", "treadle-webhook"]["webhooks"]
    assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Ignore", 3)
    assert hook["namespaceSelector"] == selector
    assert _env(objects)["TREADLE_OPERATOR_WEBHOOK_PORT"] == "10443"
    off = _objects({"webhook": {"enabled": False}})
    assert not [key for key in off if key[1].endswith("-webhook")]
    assert not [k for k in _env(off) if k.startswith("TREADLE_OPERATOR_WEBHOOK")]
    (container,) = off["Deployment", "treadle-operator"]["spec"]["template"]["spec"]["containers"]
    assert [p["name"] for p in container["ports"]] == ["http"]  # the probes' port only


def test_namespace_scope_keeps_only_the_configuration_grant_cluster_wide() -> None:
    objects = _objects({"rbac": {"scope": "namespace", "namespaces": ["team-a"]}})
    # The users' aggregated view/edit roles (rbac.userRoles) grant the operator nothing.
    users = {("ClusterRole", "treadle-view"), ("ClusterRole", "treadle-edit")}
    cluster_wide = [key for key in objects if key[0].startswith("Cluster") and key not in users]
    assert sorted(cluster_wide) == [
        ("ClusterRole", "treadle-webhook"), ("ClusterRoleBinding", "treadle-webhook")
    ]  # fmt: skip


def test_input_secret_names_are_readable_by_name_and_told_to_the_operator() -> None:
    """spec.inputFrom.secretKeyRef: only listed Secrets; ConfigMaps by get."""
    objects = _objects({"rbac": {"inputSecretNames": ["order-inputs", "billing-inputs"]}})
    role = objects["ClusterRole", "treadle-operator"]
    expected = permissions.cluster_rules(("treadle-world",), ("order-inputs", "billing-inputs"))
    assert _rules(role) == _rules({"rules": [r.as_manifest() for r in expected]})
    (secrets,) = [r for r in role["rules"] if r["resources"] == ["secrets"]]
    assert secrets["resourceNames"] == ["treadle-world", "order-inputs", "billing-inputs"]
    assert {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]} in role["rules"]
    assert _env(objects)["TREADLE_OPERATOR_INPUT_SECRETS"] == "order-inputs,billing-inputs,"
    assert "TREADLE_OPERATOR_INPUT_SECRETS" not in _env(_objects())


@pytest.mark.parametrize(
    "overrides",
    [
        {"webhook": {"failurePolicy": "Maybe"}},
        {"webhook": {"timeoutSeconds": 31}},
        {"webhook": {"port": 80}},
        {"webhook": {"enabled": True, "extra": 1}},
        {"rbac": {"inputSecretNames": ["Not_A_Name"]}},
    ],
)
def test_the_schema_refuses_bad_webhook_values(overrides: dict[str, Any]) -> None:
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for key, value in overrides.items():
        values[key] = {**values[key], **value}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(values, schema)
