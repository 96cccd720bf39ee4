"""The chart's leader election (review R4, docs/operator-ha.md): replicas, rollout, Lease RBAC."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from treadle_operator import permissions

from . import render

CHART = Path(__file__).resolve().parents[2] / "charts" / "treadle"


def _objects(overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [m.body for m in render.render_chart(CHART, overrides)]


def _deployment(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    (found,) = [o for o in _objects(overrides) if o["kind"] == "Deployment"]
    return found


def test_one_replica_by_default_two_allowed_and_rolled_out_with_a_standby_first() -> None:
    """operator.replicas: 1 by default, 2 allowed, 3 refused; RollingUpdate with no gap."""
    assert _deployment()["spec"]["replicas"] == 1
    two = _deployment({"operator": {"replicas": 2}})
    assert two["spec"]["replicas"] == 2
    assert two["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.validate(render.chart_values(CHART, {"operator": {"replicas": 2}}), schema)
    with pytest.raises(jsonschema.ValidationError, match="3 is greater than the maximum of 2"):
        jsonschema.validate(render.chart_values(CHART, {"operator": {"replicas": 3}}), schema)


def test_the_operator_knows_its_name_namespace_and_lease() -> None:
    """POD_NAME and POD_NAMESPACE from the downward API; the Lease named after the release."""
    (container,) = _deployment()["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["TREADLE_OPERATOR_LEASE_NAME"]["value"] == "treadle-operator"


def test_the_lease_role_is_namespaced_and_names_its_lease() -> None:
    """A Role in the release namespace only, rules = permissions.leader_rules, bound to the SA."""
    for overrides in (None, {"rbac": {"scope": "namespace", "namespaces": ["team-a"]}}):
        objects = _objects(overrides)
        (role,) = [o for o in objects if o["metadata"]["name"] == "treadle-operator-leader"
                   and o["kind"] == "Role"]  # fmt: skip
        (binding,) = [o for o in objects if o["metadata"]["name"] == "treadle-operator-leader"
                      and o["kind"] == "RoleBinding"]  # fmt: skip
        assert role["metadata"]["namespace"] == "treadle-system"
        expected = [r.as_manifest() for r in permissions.leader_rules("treadle-operator")]
        assert role["rules"] == expected
        assert binding["roleRef"]["name"] == "treadle-operator-leader"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "treadle", "namespace": "treadle-system"}
        ]
