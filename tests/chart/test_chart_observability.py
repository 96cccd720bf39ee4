"""The chart's monitoring of workers and ``treadle serve`` (issue 13 item 4): with
``metrics.serviceMonitor.enabled``, a PodMonitor for the operator's worker pods and a
ServiceMonitor for serve's Service (when the chart deploys serve)."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
import yaml

from treadle_operator import manifests
from treadle_operator.models import WorkflowDeploymentSpec

from . import render
from .test_chart import CHART, _by_kind

ON = {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}}


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = yaml.safe_load((CHART / "values.schema.json").read_text())
    return schema


def test_no_monitors_unless_asked() -> None:
    kinds = _by_kind()
    assert "PodMonitor" not in kinds
    assert "ServiceMonitor" not in kinds


def test_the_worker_pod_monitor_selects_the_pods_the_operator_makes() -> None:
    """The PodMonitor's selector matches a worker pod's labels and names its port."""
    (monitor,) = _by_kind(ON)["PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["name"] == "treadle-workers"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "30s"}
    spec = WorkflowDeploymentSpec.model_validate({"image": "img:1", "module": "orders.app"})
    made = manifests.worker_deployment(
        owner="orders", owner_uid="u", namespace="ns", revision="orders-abc",
        image="img:1", module="orders.app", spec=spec, role="steps", replicas=1,
    )  # fmt: skip
    pod = made["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TREADLE_WORKER_METRICS_PORT"] == str(ports["metrics"])


def test_the_worker_pod_monitor_keeps_to_the_served_namespaces() -> None:
    scoped = {**ON, "rbac": {"scope": "namespace", "namespaces": ["shop", "billing"]}}
    (monitor,) = _by_kind(scoped)["PodMonitor"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["shop", "billing"]}


def test_workers_false_leaves_the_pod_monitor_out() -> None:
    off = {"metrics": {"serviceMonitor": {"enabled": True, "workers": False}}}
    assert "PodMonitor" not in _by_kind(off)


def test_serves_service_monitor_only_when_the_chart_deploys_serve() -> None:
    """Without serve.enabled only the operator's; with it, one that selects serve's
    Service (templates/serve.yaml) by its labels and scrapes its `http` port."""
    names = [m["metadata"]["name"] for m in _by_kind(ON)["ServiceMonitor"]]
    assert names == ["treadle-operator"]
    serve = {"serve": {"enabled": True, "auth": {"secretName": "serve-tokens"}}}
    values = render.chart_values(CHART, {**ON, **serve})
    jsonschema.validate(values, _schema())
    rendered = render.render_chart(CHART, values)
    monitors = {m.body["metadata"]["name"]: m.body for m in rendered if m.kind == "ServiceMonitor"}
    monitor = monitors["treadle-serve"]
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s"}]
    (service,) = [
        m.body
        for m in rendered
        if m.kind == "Service" and m.body["metadata"]["name"] == "treadle-serve"
    ]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert "http" in [p["name"] for p in service["spec"]["ports"]]


@pytest.mark.parametrize("key", ["workers", "serve"])
def test_the_schema_takes_the_switches_as_booleans_only(key: str) -> None:
    jsonschema.validate(render.chart_values(CHART, ON), _schema())
    bad = {"metrics": {"serviceMonitor": {key: "yes"}}}
    with pytest.raises(jsonschema.ValidationError) as refused:
        jsonschema.validate(render.chart_values(CHART, bad), _schema())
    assert key in str(list(refused.value.path))


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_operator_logs_in_the_format_asked(fmt: str) -> None:
    values = render.chart_values(CHART, {"logFormat": fmt})
    jsonschema.validate(values, _schema())
    (deployment,) = _by_kind({"logFormat": fmt})["Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TREADLE_LOG_FORMAT"] == fmt


def test_the_schema_refuses_another_log_format() -> None:
    with pytest.raises(jsonschema.ValidationError) as refused:
        jsonschema.validate(render.chart_values(CHART, {"logFormat": "yaml"}), _schema())
    assert "yaml" in refused.value.message
