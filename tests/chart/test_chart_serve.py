"""The chart's treadle serve Deployment and Service (issue 13 item 4): off by default;
when enabled, `treadle serve` over the World Secret with its tokens from a Secret (or a
trusted proxy header), probed on /healthz, locked down, with no Kubernetes API token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from . import render

CHART = Path(__file__).resolve().parents[2] / "charts" / "treadle"
ENABLED = {"serve": {"enabled": True, "auth": {"secretName": "serve-tokens"}}}


def _serve_objects(overrides: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {
        m.kind: m.body
        for m in render.render_chart(CHART, overrides)
        if m.body["metadata"]["name"].endswith("-serve")
    }


def _container(overrides: dict[str, Any]) -> dict[str, Any]:
    deployment = _serve_objects(overrides)["Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = yaml.safe_load((CHART / "values.schema.json").read_text())
    return schema


def test_serve_is_not_rendered_by_default() -> None:
    """Default values: no serve Deployment or Service (the operator's stay alone)."""
    assert _serve_objects(None) == {}


def test_enabled_serve_runs_treadle_serve_over_the_world_with_its_tokens() -> None:
    """serve.enabled: a Deployment running `treadle serve --host 0.0.0.0 --port 8080` on
    the postgres World of the World Secret, both tokens from serve.auth.secretName (the
    read-only key optional), the chart's image and replicas."""
    container = _container({"serve": {**ENABLED["serve"], "replicas": 2}})
    assert container["args"] == ["serve", "--host", "0.0.0.0", "--port", "8080"]
    assert container["image"] == "treadle:0.1.0"
    env = _env(container)
    assert env["TREADLE_WORLD"] == "postgres"
    assert env["TREADLE_DATABASE_URL"] == {
        "secretKeyRef": {"name": "treadle-world", "key": "database-url"}
    }
    assert env["TREADLE_NATS_URL"]["secretKeyRef"]["key"] == "nats-url"
    assert env["TREADLE_SERVE_TOKEN"] == {"secretKeyRef": {"name": "serve-tokens", "key": "token"}}
    assert env["TREADLE_SERVE_READONLY_TOKEN"] == {
        "secretKeyRef": {"name": "serve-tokens", "key": "readonly-token", "optional": True}
    }
    assert "TREADLE_SERVE_TRUSTED_HEADER" not in env
    deployment = _serve_objects({"serve": {**ENABLED["serve"], "replicas": 2}})["Deployment"]
    assert deployment["spec"]["replicas"] == 2


def test_serve_pods_are_probed_locked_down_and_get_no_api_token() -> None:
    """Liveness and readiness on /healthz (public); non-root, read-only root filesystem,
    no capabilities; automountServiceAccountToken false (serve needs no Kubernetes API)."""
    deployment = _serve_objects(ENABLED)["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_the_service_selects_serve_pods_only() -> None:
    """The Service <release>-serve targets the serve pods' port; its selector is not the
    operator's (component serve, not operator)."""
    objects = _serve_objects(ENABLED)
    service, deployment = objects["Service"], objects["Deployment"]
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "serve"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}
    ]
    operator = next(
        m.body for m in render.render_chart(CHART, ENABLED)
        if m.kind == "Deployment" and m.body["metadata"]["name"].endswith("-operator")
    )  # fmt: skip
    labels = operator["spec"]["selector"]["matchLabels"]
    assert labels["app.kubernetes.io/component"] == "operator"


def test_serve_behind_a_proxy_uses_the_trusted_header_and_its_own_image() -> None:
    """auth.trustedHeader (no token Secret): the header and full users reach the pod;
    serve.image overrides the chart's image; CORS origins pass on. (No TREADLE_PUBLIC_URL: the
    workers build webhook URLs, not serve.)"""
    container = _container(
        {
            "serve": {
                "enabled": True,
                "image": {"repository": "registry.example/treadle-serve", "tag": "1.2.3"},
                "auth": {"trustedHeader": "X-Forwarded-User", "trustedFullUsers": "ops"},
                "corsOrigins": "https://ui.example",
            }
        }
    )
    env = _env(container)
    assert container["image"] == "registry.example/treadle-serve:1.2.3"
    assert env["TREADLE_SERVE_TRUSTED_HEADER"] == "X-Forwarded-User"
    assert env["TREADLE_SERVE_TRUSTED_FULL_USERS"] == "ops"
    assert "TREADLE_SERVE_TOKEN" not in env
    assert env["TREADLE_SERVE_CORS_ORIGINS"] == "https://ui.example"
    assert "TREADLE_PUBLIC_URL" not in env


def test_serve_values_meet_the_schema_and_auth_is_required() -> None:
    """Enabled serve values validate; enabled without a token Secret or a trusted header is
    refused by values.schema.json (the chart never deploys an open serve)."""
    jsonschema.validate(render.chart_values(CHART, ENABLED), _schema())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(render.chart_values(CHART, {"serve": {"enabled": True}}), _schema())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            render.chart_values(CHART, {"serve": {**ENABLED["serve"], "port": "http"}}),
            _schema(),
        )
