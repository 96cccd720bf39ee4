"""Item 6 of issue 11 without a cluster: the metrics' exposition, a signal's TTL and schema,
the probe server.

The behaviour against a real API server is tests/k8s/test_operator_signals.py.
"""

from __future__ import annotations

import math
import socket
from datetime import UTC, datetime, timedelta

import aiohttp
import kopf
import pytest
import yaml
from kubernetes_asyncio import client
from pydantic import ValidationError

from treadle_operator import crds, metrics, models, plugin, signals
from treadle_operator.handlers import configure
from treadle_operator.kube import Kube
from treadle_operator.probes import Probes
from treadle_operator.settings import OperatorSettings
from treadle_operator.state import State
from treadle_operator.sync import StatusSync
from treadle_operator.worlds import Worlds


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = math.inf if value == "+Inf" else float(value)
    return out


def test_the_exposition_is_prometheus_text_with_help_type_and_escaped_labels() -> None:
    """Review operator.md §1 row Metrics: counters, gauges and a histogram as Prometheus
    scrapes them (cumulative buckets, _sum and _count, label values escaped)."""
    counter = metrics.Counter("t_total", "a counter")
    gauge = metrics.Gauge("t_gauge", "a gauge")
    histogram = metrics.Histogram("t_seconds", "a histogram", buckets=(0.1, 1.0))
    counter.inc(kind='we"ird\\')
    counter.inc(2, kind='we"ird\\')
    gauge.set(1, namespace="a", deployment="b")
    for value in (0.05, 0.5, 5.0):
        histogram.observe(value, kind="X")
    text = metrics.exposition((counter, gauge, histogram))
    lines = text.splitlines()
    assert lines[:2] == ["# HELP t_total a counter", "# TYPE t_total counter"]
    assert 't_total{kind="we\\"ird\\\\"} 3' in lines
    assert "# TYPE t_seconds histogram" in lines
    samples = _samples(text)
    assert samples['t_gauge{deployment="b",namespace="a"}'] == 1
    assert samples['t_seconds_bucket{kind="X",le="0.1"}'] == 1
    assert samples['t_seconds_bucket{kind="X",le="1.0"}'] == 2
    assert samples['t_seconds_bucket{kind="X",le="+Inf"}'] == 3
    assert samples['t_seconds_count{kind="X"}'] == 3
    assert samples['t_seconds_sum{kind="X"}'] == pytest.approx(5.55)
    assert text.endswith("\n")


def test_timed_counts_errors_but_not_the_expected_ones_and_marks_reconciled() -> None:
    kind = "UnitTestKind"
    with metrics.timed(kind, done=("ns", "wfd")):
        pass
    with pytest.raises(KeyError), metrics.timed(kind, expected=(KeyError,)):
        raise KeyError("expected")
    with pytest.raises(RuntimeError), metrics.timed(kind):
        raise RuntimeError("boom")
    assert metrics.RECONCILE_SECONDS.count(kind=kind) == 3
    assert metrics.RECONCILE_ERRORS.get(kind=kind) == 1
    assert ("ns", "wfd") in metrics.RECONCILED
    metrics.forget_deployment("ns", "wfd")
    assert ("ns", "wfd") not in metrics.RECONCILED


def _signal(status: dict[str, object], **spec: object) -> dict[str, object]:
    return {"metadata": {"name": "s", "namespace": "n", "uid": "u"},
            "spec": {"action": "Wake", "run": "r", **spec}, "status": status}  # fmt: skip


def test_a_signal_lives_its_ttl_from_when_it_was_handled_and_a_pending_one_for_ever() -> None:
    handled = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    stamp = handled.strftime("%Y-%m-%dT%H:%M:%SZ")
    later = handled + timedelta(seconds=30)
    done = _signal({"phase": "Done", "handledAt": stamp})
    assert signals.seconds_left(done, later, 3600) == 3570
    assert signals.seconds_left(_signal({"phase": "Failed", "handledAt": stamp},
                                        ttlSecondsAfterHandled=10), later, 3600) == 0  # fmt: skip
    assert signals.seconds_left(_signal({"phase": "Pending"}), later, 3600) is None
    assert signals.seconds_left(_signal({}), later, 3600) is None


def test_the_signal_crd_is_namespaced_with_short_name_columns_and_the_four_actions() -> None:
    kind = next(k for k in crds.KINDS if k.kind == "WorkflowSignal")
    crd = yaml.safe_load(crds.render_plain(kind))
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["shortNames"] == ["wfs"]
    version = crd["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["action"]
    assert spec["properties"]["action"]["enum"] == ["ResumeHook", "Wake", "Rerun", "Cancel"]
    payload = spec["properties"]["resumeHook"]["properties"]["payload"]
    assert payload["x-kubernetes-preserve-unknown-fields"] is True
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Action", "Run", "Phase", "Message", "Age"]
    with pytest.raises(ValidationError):
        models.WorkflowSignalSpec.model_validate({"action": "Explode"})


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _get(port: int, path: str) -> tuple[int, str, str]:
    url = f"http://127.0.0.1:{port}{path}"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, response.headers["Content-Type"], await response.text()


async def test_the_probe_server_is_live_at_once_and_ready_only_once_kopf_and_the_api_are() -> None:
    """Review R13 (no liveness probe): /healthz answers while the loop runs; /readyz is 503
    with the reason while kopf starts, and while the API server cannot list the
    WorkflowDeployments (here: nothing listens there); /metrics is the text format."""
    configuration = client.Configuration(host=f"http://127.0.0.1:{_free_port()}")
    api = client.ApiClient(configuration)
    kube = Kube(api)
    state = State(settings=OperatorSettings(), kube=kube, worlds=Worlds(kube),
                  sync=StatusSync(kube), namespaces=("ns",))  # fmt: skip
    port = _free_port()
    probes = Probes(state, "127.0.0.1", port)
    await probes.start()
    try:
        assert await _get(port, "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")
        status, _, text = await _get(port, "/readyz")
        assert (status, text) == (503, "kopf is starting\n")
        probes.kopf_ready.set()
        status, _, text = await _get(port, "/readyz")
        assert status == 503 and text.startswith("cannot list WorkflowDeployments: ")
        status, kind, text = await _get(port, "/metrics")
        assert status == 200 and kind.startswith("text/plain; version=0.0.4")
        assert "treadle_operator_tracked_runs 0\n" in text
        await probes.stop()
        probes = Probes(state, "127.0.0.1", port)  # stopped: the port is free again
        await probes.start()
    finally:
        await probes.stop()
        await kube.close()


@pytest.mark.parametrize(
    ("argv", "spec"),
    [
        (["resume", "r", "--token", "t", "--payload", '{"a": 1}'],
         {"run": "r", "action": "ResumeHook", "resumeHook": {"token": "t", "payload": {"a": 1}}}),
        (["resume", "r", "--payload-from-configmap", "cm:k"],
         {"run": "r", "action": "ResumeHook",
          "resumeHook": {"payloadFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}}),
        (["wake", "r", "--wait", "w1", "--wait", "w2"],
         {"run": "r", "action": "Wake", "wake": {"waits": ["w1", "w2"]}}),
        (["rerun", "r", "--input", "[1]"],
         {"run": "r", "action": "Rerun", "rerun": {"input": [1]}}),
        (["cancel", "r"], {"run": "r", "action": "Cancel", "cancel": {}}),
    ],
    ids=["resume", "resume-configmap", "wake", "rerun", "cancel"],
)  # fmt: skip
def test_the_kubectl_plugin_writes_the_signal_the_arguments_ask_for(
    argv: list[str], spec: dict[str, object]
) -> None:
    made = plugin.signal(plugin.parser().parse_args(argv))
    assert made["kind"] == "WorkflowSignal"
    assert made["metadata"] == {"generateName": f"r-{argv[0]}-"}
    assert made["spec"] == spec
    models.WorkflowSignalSpec.model_validate(made["spec"])  # the CRD's model takes it


def test_the_kubectl_plugin_refuses_what_it_cannot_use() -> None:
    with pytest.raises(plugin.PluginError, match="--payload-from-configmap: give NAME:KEY"):
        plugin.signal(plugin.parser().parse_args(["resume", "r", "--payload-from-configmap", "x"]))
    with pytest.raises(plugin.PluginError, match="--input: not JSON"):
        plugin.signal(plugin.parser().parse_args(["rerun", "r", "--input", "{"]))


def test_a_deleted_object_waits_at_most_a_second_for_a_timer_still_in_its_handler() -> None:
    """CI on bb90412: run_ttl's DELETE came back as a watch event while the timer was still
    in the call; kopf's default polls a still-running timer again after 60 s and kept the
    finalizer (and the expired WorkflowRun) that long. tests/k8s/test_operator_status_sync
    is the timeline against a real API server; this pins the setting that bounds it."""
    settings = kopf.OperatorSettings()
    assert settings.background.cancellation_polling == 60  # kopf's default, what bit us
    configure(settings)
    assert settings.background.cancellation_polling <= 1.0
    assert settings.background.instant_exit_timeout is not None
