"""The chart's operator probes, metrics Service and ServiceMonitor (issue 11 item 6;
review operator.md §1 rows Metrics and Health probes, R13 "no liveness probe")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from . import render

CHART = Path(__file__).resolve().parents[2] / "charts" / "treadle"


def _by_kind(overrides: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for manifest in render.render_chart(CHART, overrides):
        found.setdefault(manifest.kind, []).append(manifest.body)
    return found


def _container(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    (deployment,) = _by_kind(overrides)["Deployment"]
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = yaml.safe_load((CHART / "values.schema.json").read_text())
    return schema


def test_the_operator_serves_its_probes_on_the_probe_port_and_the_kubelet_asks_there() -> None:
    """TREADLE_OPERATOR_PROBE_PORT, a named container port, liveness /healthz and
    readiness /readyz on it; another probes.port moves all three."""
    for port in (8080, 9443):
        container = _container({"probes": {"port": port}})
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["TREADLE_OPERATOR_PROBE_PORT"] == str(port)
        # first; the admission webhook's port follows it (tests/chart/test_webhook.py)
        assert container["ports"][0] == {"name": "http", "containerPort": port, "protocol": "TCP"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}


def test_a_metrics_service_by_default_and_a_service_monitor_only_when_asked() -> None:
    kinds = _by_kind()
    (service,) = [s for s in kinds["Service"] if not s["metadata"]["name"].endswith("-webhook")]
    assert service["metadata"]["name"] == "treadle-operator-metrics"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]
    (deployment,) = kinds["Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert "ServiceMonitor" not in kinds
    off = _by_kind({"metrics": {"service": {"enabled": False}}})
    assert [s["metadata"]["name"] for s in off["Service"]] == ["treadle-webhook"]

    asked = {"metrics": {"serviceMonitor": {"enabled": True, "interval": "15s",
                                            "labels": {"release": "prom"}}}}  # fmt: skip
    (monitor,) = _by_kind(asked)["ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ({"probes": {"port": 0}}, "0"),
        ({"probes": {"port": 8080, "path": "/x"}}, "path"),
        ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "often"),
        ({"metrics": {"scrape": True}}, "scrape"),
    ],
    ids=["port-zero", "probe-extra-key", "interval", "metrics-extra-key"],
)
def test_schema_refuses_bad_probe_and_metrics_values(overrides: dict[str, Any], names: str) -> None:
    with pytest.raises(jsonschema.ValidationError) as refused:
        jsonschema.validate(render.chart_values(CHART, overrides), _schema())
    assert names in str(refused.value.message) + str(list(refused.value.path))


def test_the_chart_installs_the_workflow_signal_crd() -> None:
    names = {c["metadata"]["name"] for c in _by_kind()["CustomResourceDefinition"]}
    assert "workflowsignals.treadle.dev" in names
