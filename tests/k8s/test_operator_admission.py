"""The WorkflowRun admission webhook and large inputs, against the real 1.20 API server and
kubectl 1.20 (issue 11 item 2's webhook, review operator.md §2 item 5(c) and R6).

One operator serves the module, as the chart runs it: its own CA and certificate in the
Secret treadle-webhook-tls (made with the chart's Role), its CA patched into the chart's
ValidatingWebhookConfiguration (the chart's ClusterRole: that one name), which here
points at the operator's port on 127.0.0.1 (``url`` for the chart's in-cluster
``service``) and only at this module's namespace (``webhook.namespaceSelector``), so
other modules' WorkflowRuns never meet it. The last test stops the operator: with the
chart's ``failurePolicy: Fail`` a write is then refused, not let through unchecked.
"""

from __future__ import annotations

import asyncio
import copy
import json
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.config import new_client_from_config

from treadle.client import start_run
from treadle.sdk import functions
from treadle.world import ids
from treadle.worlds.production import PostgresNatsWorld
from treadle_operator import admission, runs
from treadle_operator.webhookcerts import Certificates, Material

from ..chart.render import render_chart
from ..nats.conftest import NatsServer
from ..postgres.conftest import Clones
from ..postgres.pgserver import Server as PgServer
from .harness import Kube, wait_for
from .kubectl import kubectl
from .operator_env import CHART, OperatorProcess, Shop
from .pod_node import PodNode
from .rest import ApiError
from .test_operator import _database, nats_server, operator_kubeconfig, pg_clones, pg_server

__all__ = ["nats_server", "operator_kubeconfig", "pg_clones", "pg_server"]

RELEASE_NS = "treadle-system"  # chart_identity's release namespace: the Role is made there
SELECTOR = "treadle.dev/admission-test"
CONFIGS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
INPUT_SECRET = "order-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _chart_configuration(namespace: str, port: int) -> dict[str, Any]:
    """The chart's ValidatingWebhookConfiguration, aimed at 127.0.0.1:port and ``namespace``."""
    values = {"crds": {"install": False}, "webhook": {"namespaceSelector": {
        "matchLabels": {SELECTOR: namespace}}}}  # fmt: skip
    (config,) = [
        m.body
        for m in render_chart(CHART, values, namespace=RELEASE_NS)
        if m.kind == "ValidatingWebhookConfiguration"
    ]
    for hook in config["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}"}
    return config


@pytest.fixture(scope="module")
def admitted(
    kube: Kube,
    pod_node: PodNode,
    operator_kubeconfig: Path,
    pg_server: PgServer,
    pg_clones: Clones,
    nats_server: NatsServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Shop]:
    """A shop whose operator serves the webhook the chart configures."""
    namespace = "admission-1"
    kube.rest.create(
        "/api/v1/namespaces", {"metadata": {"name": namespace, "labels": {SELECTOR: namespace}}}
    )
    # The chart's Role for rbac.inputSecretNames [order-secret] (namespace scope), here.
    scoped = {"crds": {"install": False}, "rbac": {"scope": "namespace", "namespaces": [
        namespace], "inputSecretNames": [INPUT_SECRET]}}  # fmt: skip
    for m in render_chart(CHART, scoped, namespace=RELEASE_NS):
        if m.kind in ("Role", "RoleBinding") and m.body["metadata"]["namespace"] == namespace:
            plural = "roles" if m.kind == "Role" else "rolebindings"
            kube.rest.create(f"{RBAC}/namespaces/{namespace}/{plural}", m.body)
    port = _free_port()
    config = _chart_configuration(namespace, port)
    name = config["metadata"]["name"]
    kube.rest.create(CONFIGS, config)
    log = tmp_path_factory.mktemp(namespace) / "operator.log"
    shop = Shop(
        kube=kube,
        namespace=namespace,
        database_url=_database(pg_server, pg_clones),
        nats_url=nats_server.url,
        operator=OperatorProcess(kube, namespace, log, operator_kubeconfig),
        pods=pod_node,
    )
    env = {
        "TREADLE_OPERATOR_WEBHOOK": "true",
        "TREADLE_OPERATOR_WEBHOOK_ADDRESS": "127.0.0.1",
        "TREADLE_OPERATOR_WEBHOOK_PORT": str(port),
        "TREADLE_OPERATOR_WEBHOOK_HOSTS": "127.0.0.1",
        "TREADLE_OPERATOR_WEBHOOK_CONFIG": name,
        "TREADLE_OPERATOR_WEBHOOK_SECRET": "treadle-webhook-tls",
        "TREADLE_OPERATOR_WEBHOOK_NAMESPACE": RELEASE_NS,
        "TREADLE_OPERATOR_INPUT_SECRETS": INPUT_SECRET,
        "TREADLE_OPERATOR_WEBHOOK_BUNDLE_CHECK_SECONDS": "0.5",
    }
    try:
        with pytest.MonkeyPatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            shop.operator.start()
        shop.secret()
        shop.deploy(shop.deployment, "shop:1")
        wait_for(
            lambda: all(
                h["clientConfig"].get("caBundle")
                for h in kube.rest.get(f"{CONFIGS}/{name}")["webhooks"]
            ),
            60,
            what="the operator's CA in the configuration's caBundle",
        )
        # Serving: a server-side dry run of a bad object is refused by the webhook itself.
        probe = _manifest(shop, "probe", "greet", "not an object")
        said: list[str] = []

        def answering() -> bool:
            said[:] = [_apply(shop, probe, "--dry-run=server").stderr]
            return "must be an object" in said[0]

        try:
            wait_for(answering, 60, what="the webhook answering")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; kubectl said: {said}") from None
        shop.latest()
        yield shop
    finally:
        kube.rest.delete(f"{CONFIGS}/{name}")
        shop.operator.stop()
        print(shop.report())
        kube.rest.delete(f"/api/v1/namespaces/{namespace}")


def _manifest(
    shop: Shop, name: str, workflow: str, input: Any = None, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "treadle.dev/v1alpha1", "kind": "WorkflowRun",
        "metadata": {"name": name},
        "spec": {"deployment": shop.deployment, "workflow": workflow, **spec},
    }  # fmt: skip
    if input is not None:
        body["spec"]["input"] = input
    return body


def _apply(shop: Shop, manifest: dict[str, Any], *flags: str) -> Any:
    """``kubectl apply`` (client-side: kubectl keeps its last-applied copy) of ``manifest``."""
    return kubectl(
        shop.kube.kubeconfig, "-n", shop.namespace, "apply", *flags, "-f", "-",
        stdin=yaml.safe_dump(manifest),
    )  # fmt: skip


def _refused(done: Any, *needles: str) -> str:
    assert done.returncode != 0, f"kubectl apply passed: {done.stdout}"
    assert "denied the request" in done.stderr, done.stderr
    for needle in needles:
        assert needle in done.stderr, done.stderr
    return str(done.stderr)


def _started(shop: Shop, name: str) -> dict[str, Any]:
    return {c["type"]: c for c in shop.status(name).get("conditions", [])}.get("Started", {})


def test_a_started_runs_spec_is_immutable_and_its_other_fields_stay_editable(
    admitted: Shop,
) -> None:
    """Review §2 5(c): edits to spec.workflow/input/deployment after the start were silently
    ignored. Now `kubectl apply` of each is refused with the field named; ttl, onDelete,
    labels and annotations change; spec.cancel goes to true (and cancels) but never back."""
    shop = admitted
    held = _manifest(shop, "held", "approval", {"order_id": "im-1"})
    assert _apply(shop, held).returncode == 0
    run_id = wait_for(lambda: shop.status("held").get("runId"), 60, what="the run started")
    for field, value in (
        ("input", {"order_id": "im-2"}),
        ("workflow", "greet"),
        ("deployment", "elsewhere"),
        ("runKey", "second"),
    ):
        edited = copy.deepcopy(held)
        edited["spec"][field] = value
        _refused(
            _apply(shop, edited), f"spec.{field} is immutable once the run started (run {run_id})"
        )
    moved = copy.deepcopy(held)
    del moved["spec"]["input"]
    moved["spec"]["inputFrom"] = {"configMapKeyRef": {"name": "later", "key": "input.json"}}
    _refused(_apply(shop, moved), "spec.input is immutable", "spec.inputFrom is immutable")
    assert shop.run("held")["spec"]["input"] == {"order_id": "im-1"}  # type: ignore[index]

    kept = copy.deepcopy(held)
    kept["metadata"]["labels"] = {"team": "orders"}
    kept["metadata"]["annotations"] = {"note": "edited"}
    kept["spec"].update(ttlSecondsAfterFinished=3600, onDelete="Orphan")
    done = _apply(shop, kept)
    assert done.returncode == 0, done.stderr
    obj = shop.run("held")
    assert obj is not None
    assert obj["spec"]["ttlSecondsAfterFinished"] == 3600 and obj["spec"]["onDelete"] == "Orphan"
    assert obj["metadata"]["labels"]["team"] == "orders"
    assert obj["metadata"]["annotations"]["note"] == "edited"

    kept["spec"].update(onDelete="Cancel", cancel=True)
    done = _apply(shop, kept)
    assert done.returncode == 0, done.stderr
    shop.phase("held", "Cancelled", timeout=60)
    kept["spec"]["cancel"] = False
    _refused(_apply(shop, kept), "spec.cancel cannot go back to false")


def test_an_inline_input_over_the_limit_and_invalid_values_are_refused_at_create(
    admitted: Shop,
) -> None:
    """Issue 11: a 200 KiB input applied with kubectl stayed Pending for ever. Now the CREATE
    is refused with the input's size and the limit (128 KiB, the World's start message);
    values the schema cannot express are refused with the field named. Nothing is stored."""
    shop = admitted
    big = {"name": "x" * (200 * 1024)}
    size = admission.input_size(big)
    assert size > admission.INLINE_INPUT_LIMIT
    _refused(
        _apply(shop, _manifest(shop, "big", "greet", big)),
        f"spec.input is {size:,} bytes as JSON, over the 131,072-byte (128 KiB) limit",
        "spec.inputFrom",
    )
    cases = {
        "scalar": (_manifest(shop, "scalar", "greet", 42), "spec.input must be an object"),
        "both": (
            _manifest(shop, "both", "greet", {"name": "a"},
                      inputFrom={"configMapKeyRef": {"name": "c", "key": "k"}}),
            "spec.input and spec.inputFrom are both set",
        ),
        "neither": (
            _manifest(shop, "neither", "greet", inputFrom={}),
            "spec.inputFrom must name exactly one of configMapKeyRef and secretKeyRef",
        ),
        "nul": (_manifest(shop, "nul", "greet", {"name": "a\x00b"}), "spec.input.name: a string"),
    }  # fmt: skip
    for manifest, needle in cases.values():
        _refused(_apply(shop, manifest), needle)
    typo = _apply(shop, _manifest(shop, "typo", "greet", {"name": "a"}, deployment="Shop_1"))
    assert typo.returncode != 0 and "spec.deployment" in typo.stderr, typo.stderr  # the schema
    for name in ("big", "typo", *cases):
        assert shop.run(name) is None, f"{name} was stored"


def test_an_inline_input_at_the_limit_applied_client_side_completes(admitted: Shop) -> None:
    """Review R6: kubectl's last-applied copy plus kopf's last-handled copy of spec.input
    passed the 256 KiB annotation limit, and the object stayed Pending. kopf's diff base no
    longer keeps spec.input: an input just under 128 KiB applied client-side completes."""
    shop = admitted
    name = "y" * (admission.INLINE_INPUT_LIMIT - 200)
    assert admission.input_size({"name": name}) <= admission.INLINE_INPUT_LIMIT
    done = _apply(shop, _manifest(shop, "edge", "greet", {"name": name}))
    assert done.returncode == 0, done.stderr
    status = shop.phase("edge", "Completed", "Failed", timeout=90)
    assert status["phase"] == "Completed", status
    assert name in json.dumps(shop.world_run(status["runId"])["output"])
    annotations = shop.run("edge")["metadata"]["annotations"]  # type: ignore[index]
    assert len(annotations["kubectl.kubernetes.io/last-applied-configuration"]) > len(name)
    handled = json.loads(annotations["treadle.dev/last-handled-configuration"])
    assert "input" not in handled["spec"] and handled["spec"]["workflow"] == "greet"


def test_an_input_from_a_config_map_waits_for_it_and_completes(admitted: Shop) -> None:
    """Review R6: spec.inputFrom carries inputs to the World's limit, past the inline one.
    The ConfigMap missing, then not JSON: Pending with the reason naming it (retried); then
    fixed in place: the run completes with it (120 KiB, and 300 KiB)."""
    shop = admitted
    cms = f"/api/v1/namespaces/{shop.namespace}/configmaps"
    source = {"configMapKeyRef": {"name": "order-input", "key": "input.json"}}
    assert _apply(shop, _manifest(shop, "from-cm", "greet", inputFrom=source)).returncode == 0
    missing = wait_for(
        lambda: (c := _started(shop, "from-cm")).get("reason") == "InputNotFound" and c, 60
    )
    assert f"ConfigMap {shop.namespace}/order-input not found" in missing["message"]
    assert shop.status("from-cm")["phase"] == "Pending"
    shop.kube.rest.create(
        cms, {"metadata": {"name": "order-input"}, "data": {"input.json": "{not json"}}
    )
    invalid = wait_for(
        lambda: (c := _started(shop, "from-cm")).get("reason") == "InvalidInputFrom" and c, 60
    )
    assert (
        f"ConfigMap {shop.namespace}/order-input key input.json is not JSON" in (invalid["message"])
    )
    medium, large = "m" * (120 * 1024), "l" * (300 * 1024)
    shop.kube.rest.patch(
        f"{cms}/order-input", {"data": {"input.json": json.dumps({"name": medium})}}
    )
    shop.kube.rest.create(
        cms, {"metadata": {"name": "large-input"}, "data": {"in": json.dumps({"name": large})}}
    )
    large_source = {"configMapKeyRef": {"name": "large-input", "key": "in"}}
    assert (
        _apply(shop, _manifest(shop, "from-big-cm", "greet", inputFrom=large_source)).returncode
        == 0
    )
    for run, name in (("from-cm", medium), ("from-big-cm", large)):
        status = shop.phase(run, "Completed", "Failed", timeout=90)
        assert status["phase"] == "Completed", status
        assert name in json.dumps(shop.world_run(status["runId"])["output"])


def test_a_secret_input_only_from_an_allowed_secret_never_the_worlds(admitted: Shop) -> None:
    """spec.inputFrom.secretKeyRef reads only Secrets the chart lists (rbac.inputSecretNames:
    order-secret, with the chart's Role for it) and never the deployment's World Secret
    (Failed with the reason, not Pending). The secret input never shows in the object."""
    shop = admitted
    shop.kube.rest.create(
        f"/api/v1/namespaces/{shop.namespace}/secrets",
        {"metadata": {"name": INPUT_SECRET},
         "stringData": {"input.json": json.dumps({"name": "s3cret"})}},
    )  # fmt: skip
    source = {"secretKeyRef": {"name": INPUT_SECRET, "key": "input.json"}}
    assert _apply(shop, _manifest(shop, "from-secret", "greet", inputFrom=source)).returncode == 0
    status = shop.phase("from-secret", "Completed", "Failed", timeout=60)
    assert status["phase"] == "Completed", status
    assert "s3cret" in json.dumps(shop.world_run(status["runId"])["input"])
    assert "s3cret" not in json.dumps(shop.run("from-secret")["spec"])  # type: ignore[index]
    for run, secret, needle in (
        ("from-world", "treadle-world", "the World Secret of the deployment"),
        ("from-other", "orders", "not one the operator may read inputs from"),
    ):
        source = {"secretKeyRef": {"name": secret, "key": "database-url"}}
        assert _apply(shop, _manifest(shop, run, "greet", inputFrom=source)).returncode == 0
        status = shop.phase(run, "Failed", timeout=60)
        assert status["reason"] == "InputSecretNotAllowed"
        assert needle in status["error"]["message"]
        assert not status.get("runId")


def _start_from_code(shop: Shop, revision: str, input: dict[str, Any]) -> str:
    """A run started with the client on ``revision`` (argv cannot carry 200 KiB); its id."""

    async def start() -> str:
        world = await PostgresNatsWorld.connect(
            shop.database_url, shop.nats_url, deployment_id="test-starter"
        )
        try:
            run = await start_run(
                world, name="greet", data=functions.encode_arguments((), input, "greet"),
                deployment_id=revision, spec_version=9,
                run_id=ids.new_run_id(),
            )  # fmt: skip
            return run.run_id
        finally:
            await world.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, start()).result()


def test_a_mirrored_run_with_a_large_input_shows_without_it(admitted: Shop) -> None:
    """mirrorRuns under the webhook: the operator's own WorkflowRun for a code-started run
    with a 200 KiB input would be refused at CREATE; it is made without the input instead,
    an annotation saying why, and follows the run to Completed."""
    shop = admitted
    revision = shop.latest()
    shop.kube.rest.patch(shop.path("workflowdeployments", "shop"), {"spec": {"mirrorRuns": True}})
    wait_for(
        lambda: (
            (w := shop.wfd())["metadata"]["generation"]
            == (w.get("status") or {}).get("observedGeneration")
        ),
        30,
        what="mirrorRuns seen",
    )
    run_id = _start_from_code(shop, revision, {"name": "w" * (200 * 1024)})

    def mirrored() -> dict[str, Any] | None:
        items = shop.kube.rest.get(shop.path("workflowruns"))["items"]
        mine = [i for i in items if (i.get("status") or {}).get("runId") == run_id]
        return mine[0] if mine and mine[0]["status"].get("phase") == "Completed" else None

    obj = wait_for(mirrored, 90, what="the mirrored run completed")
    assert "input" not in obj["spec"]
    omitted = obj["metadata"]["annotations"][runs.INPUT_OMITTED]
    assert omitted.startswith(f"{admission.input_size({'name': 'w' * (200 * 1024)})} bytes")


def test_replicas_share_one_certificate_through_the_secret(admitted: Shop) -> None:
    """Two replicas starting at once with no Secret yet end up serving the same CA and
    certificate (one creates the Secret, the other reads it, or loses the race and re-reads);
    new Service names renew the certificate under the same CA, so the caBundle stays."""
    shop = admitted

    async def race() -> tuple[Material, Material, Material, dict[str, str]]:
        api = await new_client_from_config(config_file=str(shop.kube.kubeconfig))
        try:
            core = client.CoreV1Api(api)
            pair = [Certificates(core, shop.namespace, "race-tls", ["127.0.0.1"]) for _ in "ab"]
            first, second = await asyncio.gather(*(c.ensure() for c in pair))
            more = ["127.0.0.1", "treadle-webhook.treadle-system.svc"]
            renamed = await Certificates(core, shop.namespace, "race-tls", more).ensure()
            stored = await core.read_namespaced_secret("race-tls", shop.namespace)
            return first, second, renamed, dict(stored.data)
        finally:
            await api.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        first, second, renamed, stored = pool.submit(asyncio.run, race()).result()
    assert first == second
    assert renamed.ca_cert == first.ca_cert and renamed.cert != first.cert
    assert Material.from_secret_data(stored) == renamed


def test_a_blanked_ca_bundle_is_put_back_by_the_operator(admitted: Shop) -> None:
    """A tool that replaces the configuration whole (kubectl replace, the escape hatch then
    a reinstall) drops the caBundle: the API server then cannot trust the webhook and, under
    Fail, refuses writes; the operator's check puts the CA back and writes pass again."""
    shop = admitted
    path = f"{CONFIGS}/treadle-webhook"
    config = shop.kube.rest.get(path)
    bundle = config["webhooks"][0]["clientConfig"]["caBundle"]
    hooks = copy.deepcopy(config["webhooks"])
    for hook in hooks:
        del hook["clientConfig"]["caBundle"]
    blanked = shop.kube.rest.patch(path, {"webhooks": hooks})  # a merge patch: the whole list
    assert not blanked["webhooks"][0]["clientConfig"].get("caBundle")
    back = wait_for(
        lambda: shop.kube.rest.get(path)["webhooks"][0]["clientConfig"].get("caBundle"),
        30,
        what="the caBundle put back",
    )
    assert back == bundle
    done = wait_for(
        lambda: (
            (d := _apply(shop, _manifest(shop, "after-bundle", "greet", {"name": "b"}))).returncode
            == 0
            and d
        ),
        30,
        what="writes admitted again",
    )
    assert done.returncode == 0


def test_with_the_operator_down_writes_are_refused_by_failure_policy_fail(admitted: Shop) -> None:
    """failurePolicy Fail (the chart's default): no operator answering, a WorkflowRun write is
    refused with the webhook named, never let through unchecked. (Runs last: it stops the
    module's operator.)"""
    shop = admitted
    shop.operator.stop()
    done = _apply(shop, _manifest(shop, "while-down", "greet", {"name": "z"}))
    assert done.returncode != 0, done.stdout
    assert "failed calling webhook" in done.stderr, done.stderr
    assert "workflowruns.webhook.treadle.dev" in done.stderr, done.stderr
    with pytest.raises(ApiError):
        shop.kube.rest.get(shop.path("workflowruns", "while-down"))
