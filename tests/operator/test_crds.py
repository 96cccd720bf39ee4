"""The CRDs generated from the models: fresh in the repository, structural, deterministic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from treadle_operator import crds

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_crds_are_what_the_models_generate() -> None:
    """A change to the models without `treadle crds` (and a commit) fails here."""
    assert crds.stale(ROOT) == [], "run `treadle crds` and commit crds/ and the chart"


def test_generation_is_deterministic() -> None:
    assert crds.rendered() == crds.rendered()


def _walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)]
    for name, child in (node.get("properties") or {}).items():
        found += _walk(child, f"{path}.{name}")
    if "items" in node:
        found += _walk(node["items"], f"{path}[]")
    return found


def test_schemas_are_structural() -> None:
    """No $ref or anyOf; a type on every field or free-form marked as such."""
    for kind in crds.KINDS:
        document = yaml.safe_load(crds.render_plain(kind))
        schema = document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, node in _walk(schema):
            assert "$ref" not in node and "anyOf" not in node, path
            assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
            assert node.get("default", 0) is not None, path


def test_free_form_and_optional_fields() -> None:
    run = yaml.safe_load(crds.render_plain(crds.KINDS[1]))
    props = run["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    assert props["spec"]["properties"]["input"]["x-kubernetes-preserve-unknown-fields"] is True
    ttl = props["spec"]["properties"]["ttlSecondsAfterFinished"]
    assert ttl == {**ttl, "type": "integer", "nullable": True, "minimum": 0}
    assert props["spec"]["required"] == ["deployment", "workflow"]
    columns = [c["name"] for c in run["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns == [
        "Workflow", "Revision", "Phase", "Steps", "Started", "Duration", "Message", "Age"
    ]  # fmt: skip
    assert props["spec"]["properties"]["onDelete"]["enum"] == ["Cancel", "Orphan"]
    assert props["spec"]["properties"]["runKey"]["maxLength"] == 253
    assert run["spec"]["names"]["shortNames"] == ["wfr"]


def test_the_chart_copy_is_switched_by_values() -> None:
    text = crds.render_chart(crds.KINDS[0])
    assert text.startswith("{{- if .Values.crds.install }}\n" + crds.HEADER)
    assert "{{- if .Values.crds.keep }}" in text
    assert text.endswith("{{- end }}\n")


def test_the_schedule_crd_has_cronjobs_columns_and_refuses_what_its_schema_can() -> None:
    """Issue 11 item 7: `kubectl get wfsched` reads as `kubectl get cronjob`; a schedule
    without the cron's shape or a run template is refused at the API server."""
    (kind,) = [k for k in crds.KINDS if k.kind == "WorkflowSchedule"]
    crd = yaml.safe_load(crds.render_plain(kind))
    version = crd["spec"]["versions"][0]
    columns = [(c["name"], c["type"]) for c in version["additionalPrinterColumns"]]
    assert columns == [
        ("Schedule", "string"), ("Suspend", "boolean"), ("Active", "integer"),
        ("Last Schedule", "date"), ("Age", "date"),
    ]  # fmt: skip
    assert crd["spec"]["names"]["shortNames"] == ["wfsched"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["schedule", "runTemplate"]
    assert spec["properties"]["concurrencyPolicy"]["enum"] == ["Allow", "Forbid", "Replace"]
    assert spec["properties"]["schedule"]["pattern"]
    assert spec["properties"]["runTemplate"]["required"] == ["deployment", "workflow"]
    assert (spec["properties"]["successfulRunsHistoryLimit"]["default"],
            spec["properties"]["failedRunsHistoryLimit"]["default"]) == (3, 1)  # fmt: skip
