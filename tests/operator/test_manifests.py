"""Worker Deployments for a revision: pinned by deployment id, secrets by reference."""

from __future__ import annotations

from treadle_operator import manifests
from treadle_operator.models import WorkflowDeploymentSpec


def test_a_revision_runs_its_own_image_and_deployment_id() -> None:
    spec = WorkflowDeploymentSpec.model_validate(
        {"image": "img:2", "module": "orders.app", "steps": {"concurrency": 4},
         "env": [{"name": "EXTRA", "value": "1"}]}
    )  # fmt: skip
    made = manifests.worker_deployment(
        owner="orders", owner_uid="u", namespace="ns", revision="orders-abc123",
        image="img:1", module="orders.old", spec=spec, role="steps", replicas=3,
    )  # fmt: skip
    container = made["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "img:1"  # the revision's, not the spec's newest
    assert container["args"] == ["worker", "orders.old", "--role", "steps", "--concurrency", "4"]
    env = {e["name"]: e for e in container["env"]}
    assert env["TREADLE_DEPLOYMENT_ID"]["value"] == "orders-abc123"
    assert env["TREADLE_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "treadle-world",
        "key": "database-url",
    }
    assert env["EXTRA"]["value"] == "1"
    assert made["metadata"]["name"] == "orders-abc123-steps"
    assert made["metadata"]["ownerReferences"][0]["uid"] == "u"
    assert made["spec"]["replicas"] == 3
    assert made["spec"]["selector"]["matchLabels"] == {
        "treadle.dev/revision": "orders-abc123",
        "treadle.dev/role": "steps",
    }


def test_workers_get_the_payload_keys_from_the_world_secret_when_it_has_them() -> None:
    """Issue 16 item 4: TREADLE_PAYLOAD_KEY from the World Secret's ``payload-key``, optional
    (a Secret without it leaves the variable unset, so values are stored unencrypted)."""
    spec = WorkflowDeploymentSpec.model_validate({"image": "img:1", "module": "orders.app"})
    made = manifests.worker_deployment(
        owner="orders", owner_uid="u", namespace="ns", revision="orders-abc123",
        image="img:1", module="orders.app", spec=spec, role="orchestrator", replicas=1,
    )  # fmt: skip
    env = {e["name"]: e for e in made["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TREADLE_PAYLOAD_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "treadle-world",
        "key": "payload-key",
        "optional": True,
    }
