"""The WorkflowRun admission rules (``treadle_operator.admission``) and the webhook's own
certificates (``treadle_operator.webhook``), without an API server (issue 11 item 2, review
operator.md §2 item 5(c) and R6). tests/k8s/test_operator_admission.py runs them for real."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest
from cryptography import x509

from treadle_operator import admission, webhook

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
    material = webhook.issue(hosts, NOW)
    cert = x509.load_pem_x509_certificate(material.cert)
    ca = x509.load_pem_x509_certificate(material.ca_cert)
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)  # raises when the CA did not sign it
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["treadle-webhook.treadle-system.svc"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert webhook.renewal(material, hosts, NOW) is None
    assert webhook.Material.from_secret_data(material.secret_data()) == material


def test_renewal_is_due_near_the_end_or_for_other_names_and_keeps_the_ca() -> None:
    hosts = ["a.svc"]
    material = webhook.issue(hosts, NOW)
    assert webhook.renewal(None, hosts, NOW) == "no certificate yet"
    late = NOW + dt.timedelta(days=webhook.CERT_DAYS) - dt.timedelta(days=10)
    assert "the serving certificate ends" in (webhook.renewal(material, hosts, late) or "")
    assert "not for all of" in (webhook.renewal(material, ["b.svc"], NOW) or "")
    renewed = webhook.issue(hosts, late, material)
    assert renewed.ca_cert == material.ca_cert and renewed.cert != material.cert
    assert webhook.renewal(renewed, hosts, late) is None


def test_secret_data_missing_a_key_is_no_material() -> None:
    data = webhook.issue(["a"], NOW).secret_data()
    del data["ca.key"]
    assert webhook.Material.from_secret_data(data) is None
    assert webhook.Material.from_secret_data(None) is None


def test_hosts_default_to_the_loopback_names() -> None:
    assert webhook.parse_hosts("") == ["localhost", "127.0.0.1"]
    assert webhook.parse_hosts(" a.svc, b ,") == ["a.svc", "b"]
