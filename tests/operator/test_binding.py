"""Which WorkflowRun may track or cancel a run: decided from the run's recorded binding.

Security review M6: the annotation ``treadle.dev/mirrored-run`` made the
operator adopt, and on delete cancel, any run. The real-API regression is in
``tests/k8s/test_operator_security.py``; these are the rules one by one.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import JsonValue

from treadle.world import ids
from treadle.world.records import RunRecord
from treadle_operator import binding

NOW = datetime(2026, 1, 1, tzinfo=UTC)
RUN_ID = "wrun_01JABCDEFGHJKMNPQRSTVWXYZ0"


def _run(attributes: dict[str, JsonValue], deployment_id: str = "shop-abc123") -> RunRecord:
    return RunRecord(
        run_id=RUN_ID, workflow_name="greet", status="running", deployment_id=deployment_id,
        spec_version=9, input=None, created_at=NOW, updated_at=NOW, seq=1, seq_in_band=1,
        attributes=attributes,
    )  # fmt: skip


def _wfr(namespace: str, name: str, deployment: str = "shop") -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name}, "spec": {"deployment": deployment}}


def _wfd(*revisions: str) -> dict[str, Any]:
    return {"status": {"revisions": [{"id": r} for r in revisions]}}


def test_the_object_a_run_was_started_for_owns_it() -> None:
    run = _run(binding.attributes("team-a", "order-1", "shop"))
    assert binding.refusal(run, _wfr("team-a", "order-1"), _wfd()) is None


def test_another_object_or_namespace_or_deployment_does_not() -> None:
    run = _run(binding.attributes("team-a", "order-1", "shop"))
    for other in (
        _wfr("team-b", "order-1"),
        _wfr("team-a", "thief"),
        _wfr("team-a", "order-1", "x"),
    ):
        problem = binding.refusal(run, other, _wfd("shop-abc123"))
        assert problem is not None and "was started for WorkflowRun team-a/order-1" in problem


def test_a_run_bound_before_the_binding_attribute_keeps_its_namespace_and_name() -> None:
    run = _run({binding.STARTED_BY: "team-a/order-1"})
    assert binding.refusal(run, _wfr("team-a", "order-1"), None) is None
    assert binding.refusal(run, _wfr("team-b", "order-1"), None) is not None


def test_a_code_started_run_shows_only_as_the_mirror_of_its_own_deployment() -> None:
    run = _run({}, deployment_id="shop-abc123")
    mirror = binding.mirror_name("greet", RUN_ID)
    assert binding.refusal(run, _wfr("team-a", mirror), _wfd("shop-abc123")) is None
    # Another deployment (the revision is not one of its own), or no such deployment.
    assert "not a revision" in str(binding.refusal(run, _wfr("team-b", mirror), _wfd("x-1")))
    assert "not a revision" in str(binding.refusal(run, _wfr("team-b", mirror), None))
    # Its own deployment, but under another name than the mirror's.
    assert "only its mirror" in str(binding.refusal(run, _wfr("team-a", "x"), _wfd("shop-abc123")))


def test_user_attributes_do_not_make_a_code_started_run_anyones() -> None:
    """A forged-looking attribute is still a binding: it names someone else, so it is refused."""
    run = _run({binding.BINDING: "team-a/order-1"})
    assert binding.refusal(run, _wfr("team-a", "order-1"), _wfd("shop-abc123")) is not None


def _keyed(namespace: str, name: str, key: str | None, deployment: str = "shop") -> dict[str, Any]:
    body = _wfr(namespace, name, deployment)
    if key is not None:
        body["spec"]["runKey"] = key
    return body


def test_the_run_id_derives_from_namespace_name_and_run_key() -> None:
    """Issue 11 item 2: re-applying the same object names the same run; a new key another."""
    first = binding.run_id("team-a", "nightly", None)
    assert first == binding.run_id("team-a", "nightly", None)
    assert ids.is_run_id(first) and ids.is_keyed_run_id(first)
    others = {
        binding.run_id("team-b", "nightly", None),
        binding.run_id("team-a", "nightly-2", None),
        binding.run_id("team-a", "nightly", "2026-01-02"),
        binding.run_id("team-a", "nightly", "2026-01-03"),
    }
    assert first not in others and len(others) == 4


def test_the_run_key_is_part_of_the_binding() -> None:
    """A run started under one key is not the run of the same object under another key."""
    run = _run(binding.attributes("team-a", "nightly", "shop", "k1"))
    assert binding.refusal(run, _keyed("team-a", "nightly", "k1"), None) is None
    problem = binding.refusal(run, _keyed("team-a", "nightly", "k2"), None)
    assert problem is not None and "runKey k1" in problem and "runKey k2" in problem
    assert binding.refusal(run, _keyed("team-a", "nightly", None), None) is not None
    unkeyed = _run(binding.attributes("team-a", "nightly", "shop"))
    assert binding.BINDING in unkeyed.attributes
    assert "runKey" not in unkeyed.attributes[binding.BINDING]  # type: ignore[operator]
    assert binding.refusal(unkeyed, _keyed("team-a", "nightly", None), None) is None
    assert binding.refusal(unkeyed, _keyed("team-a", "nightly", "k1"), None) is not None
