"""The WorkflowRun admission rules (``treadle_operator.admission``), the webhook's answers
and HTTPS server (``webhook``) and its certificates (``webhookcerts``), without an API
server (issue 11 item 2, review operator.md §2 item 5(c) and R6).
tests/k8s/test_operator_admission.py runs them against the real one."""

from __future__ import annotations

import copy
import datetime as dt
import socket
import ssl
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import pytest
import yaml
from cryptography import x509

from treadle_operator import admission, crds, webhook, webhookcerts
from treadle_operator.errors import WebhookUnavailable
from treadle_operator.settings import OperatorSettings
from treadle_operator.state import State

RUN_ID = "wrun_abc"


def _run(**spec: Any) -> dict[str, Any]:
    base = {"deployment": "shop", "workflow": "greet", "input": {"name": "a"}, "cancel": False}
    return {"metadata": {"name": "r", "namespace": "n"}, "spec": {**base, **spec}}


def _started(obj: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "status": {"runId": RUN_ID, "phase": "Running"}}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("input", {"name": "b"}),
        ("workflow", "other"),
        ("deployment", "elsewhere"),
        ("runKey", "k2"),
        ("inputFrom", {"configMapKeyRef": {"name": "c", "key": "k"}}),
    ],
)
def test_a_started_runs_identity_fields_are_immutable_with_the_field_named(
    field: str, value: Any
) -> None:
    """Review §2 5(c): an edit after the start was silently ignored; now it is refused."""
    old = _started(_run())
    new = copy.deepcopy(old)
    new["spec"][field] = value
    problems = admission.review("UPDATE", old, new)
    assert problems[0] == (
        f"spec.{field} is immutable once the run started (run {RUN_ID}); create a "
        "WorkflowRun of another name (or spec.runKey) for another run"
    )


def test_mutable_fields_labels_and_annotations_stay_editable_after_the_start() -> None:
    old = _started(_run())
    new = copy.deepcopy(old)
    new["spec"].update(cancel=True, ttlSecondsAfterFinished=60, onDelete="Orphan")
    new["metadata"]["labels"] = {"team": "a"}
    new["metadata"]["annotations"] = {"note": "x"}
    new["metadata"]["finalizers"] = ["treadle.dev/finalizer"]
    assert admission.review("UPDATE", old, new) == []


def test_cancel_cannot_be_taken_back_once_started() -> None:
    old = _started(_run(cancel=True))
    new = copy.deepcopy(old)
    new["spec"]["cancel"] = False
    assert admission.review("UPDATE", old, new) == [
        f"spec.cancel cannot go back to false: the run {RUN_ID} was asked to cancel, and a "
        "cancel is not undone"
    ]


def test_before_the_start_the_spec_may_change() -> None:
    """Pending (no deployment yet, say): a fix of the input or workflow is the point."""
    old = _run()
    new = _run(input={"name": "b"}, workflow="other")
    assert admission.review("UPDATE", old, new) == []


@pytest.mark.parametrize(
    ("status", "annotations", "expected"),
    [
        ({"runId": "wrun_1"}, {}, "wrun_1"),
        ({"phase": "Running"}, {}, "claimed"),
        ({"phase": "Pending"}, {}, None),
        ({}, {admission.MIRRORED: "wrun_m"}, "wrun_m"),
        (None, {}, None),
    ],
)
def test_started_is_a_run_id_a_phase_past_pending_or_a_mirrored_run(
    status: dict[str, Any] | None, annotations: dict[str, str], expected: str | None
) -> None:
    obj = {"metadata": {"annotations": annotations}, "spec": {}, "status": status}
    assert admission.started(obj) == expected


def test_an_inline_input_over_128_kib_is_refused_with_its_size_and_the_limit() -> None:
    """Issue 11: a 200 KiB input stayed Pending; now the CREATE is refused, sizes named."""
    big = {"name": "x" * (200 * 1024)}
    size = admission.input_size(big)
    (problem,) = admission.review("CREATE", None, _run(input=big))
    assert problem == (
        f"spec.input is {size:,} bytes as JSON, over the 131,072-byte (128 KiB) limit of an "
        "inline input: put it in a ConfigMap or Secret and name it in spec.inputFrom"
    )
    assert admission.INLINE_INPUT_LIMIT == 128 * 1024
    at_limit = {"name": "x" * (admission.INLINE_INPUT_LIMIT - 20)}
    assert admission.input_size(at_limit) <= admission.INLINE_INPUT_LIMIT
    assert admission.review("CREATE", None, _run(input=at_limit)) == []


def test_the_size_counts_utf8_bytes_of_compact_json() -> None:
    assert admission.input_size({"a": [1, 2]}) == len('{"a":[1,2]}')
    assert admission.input_size({"é": "ü"}) == len('{"é":"ü"}'.encode())


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({"input": 42}, "spec.input must be an object (keyword arguments) or an array"),
        ({"input": "text"}, "not a string"),
        ({"input": {"a": "x\x00"}}, "spec.input.a: a string with a NUL character"),
        (
            {"input": {"a": 1}, "inputFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
            "spec.input and spec.inputFrom are both set",
        ),
        ({"input": None, "inputFrom": {}}, "not neither"),
        (
            {
                "input": None,
                "inputFrom": {
                    "configMapKeyRef": {"name": "c", "key": "k"},
                    "secretKeyRef": {"name": "s", "key": "k"},
                },
            },
            "not spec.inputFrom.configMapKeyRef and spec.inputFrom.secretKeyRef",
        ),
    ],
)
def test_values_the_schema_cannot_express_are_refused_with_the_field_named(
    spec: dict[str, Any], needle: str
) -> None:
    problems = admission.review("CREATE", None, _run(**spec))
    assert any(needle in p for p in problems), problems


def test_a_too_deep_input_names_the_engine_setting() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(80):
        node["k"] = {}
        node = node["k"]
    (problem,) = admission.review("CREATE", None, _run(input=deep))
    assert problem.startswith("spec.input.k.k") and "TREADLE_MAX_VALUE_DEPTH" in problem


def test_an_update_leaving_the_input_alone_is_never_refused_for_it() -> None:
    """An object stored before these rules (or with the webhook off) keeps getting the
    operator's finalizer and label updates: only a change of the input is judged."""
    old = _run(input={"name": "x" * (200 * 1024)})
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = ["treadle.dev/finalizer"]
    assert admission.review("UPDATE", old, new) == []
    new["spec"]["input"] = {"name": "y" * (200 * 1024)}
    assert "over the 131,072-byte" in admission.review("UPDATE", old, new)[0]


def test_delete_and_connect_are_not_judged() -> None:
    assert admission.review("DELETE", _run(input=1), None) == []
    assert admission.review("CONNECT", None, _run(input=1)) == []


# -- the webhook's certificates -----------------------------------------------------------


NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def test_the_serving_certificate_is_for_the_service_names_and_signed_by_the_ca() -> None:
    hosts = ["treadle-webhook.treadle-system.svc", "127.0.0.1"]
    material = webhookcerts.issue(hosts, NOW)
    cert = x509.load_pem_x509_certificate(material.cert)
    ca = x509.load_pem_x509_certificate(material.ca_cert)
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)  # raises when the CA did not sign it
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["treadle-webhook.treadle-system.svc"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert webhookcerts.renewal(material, hosts, NOW) is None
    assert webhookcerts.Material.from_secret_data(material.secret_data()) == material


def test_renewal_is_due_near_the_end_or_for_other_names_and_keeps_the_ca() -> None:
    hosts = ["a.svc"]
    material = webhookcerts.issue(hosts, NOW)
    assert webhookcerts.renewal(None, hosts, NOW) == "no certificate yet"
    late = NOW + dt.timedelta(days=webhookcerts.CERT_DAYS) - dt.timedelta(days=10)
    assert "the serving certificate ends" in (webhookcerts.renewal(material, hosts, late) or "")
    assert "not for all of" in (webhookcerts.renewal(material, ["b.svc"], NOW) or "")
    renewed = webhookcerts.issue(hosts, late, material)
    assert renewed.ca_cert == material.ca_cert and renewed.cert != material.cert
    assert webhookcerts.renewal(renewed, hosts, late) is None


def test_secret_data_missing_a_key_is_no_material() -> None:
    data = webhookcerts.issue(["a"], NOW).secret_data()
    del data["ca.key"]
    assert webhookcerts.Material.from_secret_data(data) is None
    assert webhookcerts.Material.from_secret_data(None) is None


def test_hosts_default_to_the_loopback_names() -> None:
    assert webhookcerts.parse_hosts("") == ["localhost", "127.0.0.1"]
    assert webhookcerts.parse_hosts(" a.svc, b ,") == ["a.svc", "b"]


# -- the server -------------------------------------------------------------------------------


def _review(operation: str, new: Any, old: Any = None, **request: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1", "operation": operation, "object": new, "oldObject": old,
            "resource": {"group": "treadle.dev", "version": "v1alpha1",
                         "resource": "workflowruns"},
            **request,
        },
    }  # fmt: skip


def test_a_refusal_answers_422_with_every_problem_and_the_uid() -> None:
    old = _started(_run())
    new = copy.deepcopy(old)
    new["spec"].update(workflow="other", input={"name": "b"})
    answered = webhook.answer(_review("UPDATE", new, old))
    assert answered["apiVersion"] == "admission.k8s.io/v1"
    response = answered["response"]
    assert (response["uid"], response["allowed"]) == ("u-1", False)
    assert response["status"]["code"] == 422
    assert response["status"]["message"].startswith("spec.workflow is immutable")
    assert "; spec.input is immutable" in response["status"]["message"]


def test_allowed_answers_carry_no_status_and_other_resources_pass() -> None:
    assert webhook.answer(_review("CREATE", _run()))["response"] == {"uid": "u-1", "allowed": True}
    bad = _run(input=42)
    status = _review("UPDATE", bad, bad, subResource="status")
    assert webhook.answer(status)["response"]["allowed"] is True
    other = _review("CREATE", bad)
    other["request"]["resource"]["resource"] = "workflowdeployments"
    assert webhook.answer(other)["response"]["allowed"] is True
    beta = {**_review("CREATE", bad), "apiVersion": "admission.k8s.io/v1beta1"}
    assert webhook.answer(beta)["apiVersion"] == "admission.k8s.io/v1beta1"
    with pytest.raises(ValueError, match=r"no request\.uid"):
        webhook.answer({"kind": "AdmissionReview"})


async def test_the_server_answers_over_tls_on_its_path_only(tmp_path: Any) -> None:
    """The real HTTPS server (certificate in memory, no Secret, no configuration): a review
    is answered; any other path is 404, so a wrong URL fails instead of allowing all."""
    port = _free_port()
    settings = OperatorSettings(
        TREADLE_OPERATOR_WEBHOOK=True,
        TREADLE_OPERATOR_WEBHOOK_ADDRESS="127.0.0.1",
        TREADLE_OPERATOR_WEBHOOK_PORT=port,
        TREADLE_OPERATOR_WEBHOOK_HOSTS="127.0.0.1",
    )
    state = cast(State, SimpleNamespace(settings=settings, kube=SimpleNamespace(core=None)))
    server = await webhook.serve(state)
    assert server is not None and server.material is not None
    trust = ssl.create_default_context(cadata=server.material.ca_cert.decode())
    url = f"https://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            review = _review("CREATE", _run(input="text"))
            async with session.post(f"{url}{webhook.PATH}", json=review, ssl=trust) as got:
                assert got.status == 200
                answered = await got.json()
            assert answered["response"]["allowed"] is False
            assert "spec.input must be an object" in answered["response"]["status"]["message"]
            async with session.post(f"{url}/validate", json=review, ssl=trust) as got:
                assert got.status == 404
            async with session.post(f"{url}{webhook.PATH}", data="{", ssl=trust) as got:
                assert got.status == 400
    finally:
        await server.stop()


async def test_the_webhook_is_off_unless_asked_and_a_secret_needs_its_namespace() -> None:
    off = cast(State, SimpleNamespace(settings=OperatorSettings()))
    assert await webhook.serve(off) is None
    settings = OperatorSettings(
        TREADLE_OPERATOR_WEBHOOK=True, TREADLE_OPERATOR_WEBHOOK_SECRET="treadle-webhook-tls"
    )
    with pytest.raises(WebhookUnavailable, match="needs TREADLE_OPERATOR_WEBHOOK_NAMESPACE"):
        await webhook.serve(cast(State, SimpleNamespace(settings=settings)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_schema_checks_what_it_can_name_itself() -> None:
    """Names are the API server's to refuse (field named, no webhook needed)."""
    run = yaml.safe_load(crds.render_plain(crds.KINDS[1]))
    spec = run["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    name = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
    assert spec["properties"]["deployment"]["pattern"] == name
    refs = spec["properties"]["inputFrom"]["properties"]
    for ref in ("configMapKeyRef", "secretKeyRef"):
        assert refs[ref]["properties"]["name"]["pattern"] == name
        assert refs[ref]["properties"]["key"]["pattern"] == r"^[-._a-zA-Z0-9]+$"
        assert refs[ref]["required"] == ["name", "key"]
