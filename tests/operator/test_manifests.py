"""Worker Deployments for a revision: pinned by deployment id, secrets by reference."""

from __future__ import annotations

from treadle_operator import manifests, podsecurity
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
    # The URLs are files of the World Secret's volume, never env values (review R9).
    assert env["TREADLE_DATABASE_URL_FILE"]["value"] == "/var/run/treadle/world/database-url"
    assert env["TREADLE_NATS_URL_FILE"]["value"] == "/var/run/treadle/world/nats-url"
    assert "TREADLE_DATABASE_URL" not in env and "TREADLE_NATS_URL" not in env
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


def test_a_workers_identity_is_its_pods_name() -> None:
    """Issue 15 item 3: TREADLE_WORKER_ID from the downward API (metadata.name), so a
    container restarted in its pod releases what its previous incarnation held; a spec.env
    naming it is refused like the operator's other variables."""
    made = _made(_spec())
    env = {e["name"]: e for e in made["spec"]["template"]["spec"]["containers"][0]["env"]}  # type: ignore[index]
    assert env["TREADLE_WORKER_ID"] == {
        "name": "TREADLE_WORKER_ID",
        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
    }
    reserved = podsecurity.reserved_names(manifests.operator_env(_spec(), "-"))
    assert "TREADLE_WORKER_ID" in reserved


def _spec(**extra: object) -> WorkflowDeploymentSpec:
    return WorkflowDeploymentSpec.model_validate({"image": "img:1", "module": "m", **extra})


def _made(spec: WorkflowDeploymentSpec, **extra: object) -> dict[str, object]:
    return manifests.worker_deployment(
        owner="orders", owner_uid="u", namespace="ns", revision="orders-abc123",
        image="img:1", module="m", spec=spec, role="steps", replicas=1, **extra,  # type: ignore[arg-type]
    )  # fmt: skip


def test_the_world_urls_are_files_of_a_read_only_secret_volume_with_the_transport_files() -> None:
    """Review R9: the Secret's URL keys (whatever the spec names them) and its file
    transport keys are items of one Secret volume; env-kind transport keys stay env."""
    spec = _spec(world={"secretName": "w", "databaseUrlKey": "pg", "natsUrlKey": "mq"})
    made = _made(spec, transport_keys=frozenset({"nats-creds", "nats-user"}))
    pod = made["spec"]["template"]["spec"]  # type: ignore[index]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "treadle-world-files"]
    assert volume["secret"] == {
        "secretName": "w",
        "defaultMode": 0o440,
        "items": [
            {"key": "pg", "path": "database-url"},
            {"key": "mq", "path": "nats-url"},
            {"key": "nats-creds", "path": "nats-creds"},
        ],
    }
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["TREADLE_NATS_CREDS_FILE"]["value"] == "/var/run/treadle/world/nats-creds"
    assert env["TREADLE_NATS_USER"]["valueFrom"]["secretKeyRef"] == {
        "name": "w",
        "key": "nats-user",
    }


def test_the_pod_template_carries_the_world_secret_checksum() -> None:
    """Review R9: a changed checksum changes the pod template, so the Deployment rolls."""
    one = _made(_spec(), secret_checksum="abc")
    two = _made(_spec(), secret_checksum="def")
    annotations = one["spec"]["template"]["metadata"]["annotations"]  # type: ignore[index]
    assert annotations["treadle.dev/world-secret-checksum"] == "abc"
    assert set(annotations) == {"treadle.dev/world-secret-checksum", "treadle.dev/template-hash"}
    assert one["spec"]["template"] != two["spec"]["template"]  # type: ignore[index]


def test_a_spec_env_setting_a_url_or_its_file_is_refused() -> None:
    """The runtime reads TREADLE_DATABASE_URL before its _FILE: both stay reserved."""
    from treadle_operator import podsecurity, transport

    every = frozenset(transport.SECRET_KEYS)
    for name in ("TREADLE_DATABASE_URL", "TREADLE_DATABASE_URL_FILE", "TREADLE_NATS_URL"):
        spec = _spec(env=[{"name": name, "value": "x"}])
        refused = podsecurity.reserved_env(spec, manifests.operator_env(spec, "-", every))
        assert refused is not None and f"sets {name}," in refused


def test_a_crashing_worker_leaves_its_logs_tail_as_the_termination_message() -> None:
    """A real kubelet's termination message is empty unless the container says to fall
    back to its log: the crash-loop condition would say "exit code 1" and not why (found
    on the real node, tests/k8s: a module the image lacks)."""
    spec = WorkflowDeploymentSpec.model_validate({"image": "img:1", "module": "orders.app"})
    made = manifests.worker_deployment(
        owner="orders", owner_uid="u", namespace="ns", revision="orders-abc123",
        image="img:1", module="orders.app", spec=spec, role="orchestrator", replicas=1,
    )  # fmt: skip
    container = made["spec"]["template"]["spec"]["containers"][0]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
