"""Worker pods run restricted, and a WorkflowDeployment cannot override the operator's env.

Security review M5: worker pods had ``securityContext: null`` and a mounted
``default`` token, and ``spec.env`` could set a second ``TREADLE_DEPLOYMENT_ID``
(the last duplicate wins) to consume another revision's messages.
"""

from __future__ import annotations

from typing import Any

import pytest

from treadle_operator import manifests, podsecurity
from treadle_operator.models import WorkflowDeploymentSpec


def _pod(**spec: Any) -> dict[str, Any]:
    made = manifests.worker_deployment(
        owner="orders", owner_uid="u", namespace="ns", revision="orders-abc123",
        image="img:1", module="orders.app",
        spec=WorkflowDeploymentSpec.model_validate({"image": "img:1", "module": "m", **spec}),
        role="orchestrator", replicas=1,
    )  # fmt: skip
    pod: dict[str, Any] = made["spec"]["template"]["spec"]
    return pod


def test_worker_pods_get_the_restricted_security_context_by_default() -> None:
    pod = _pod()
    (container,) = pod["containers"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "fsGroup": 10001,  # the World Secret's 0440 files readable to the image's user
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    # A read-only root needs somewhere to write temporary files.
    assert container["volumeMounts"][0] == {"name": "tmp", "mountPath": "/tmp"}
    assert pod["volumes"][0] == {"name": "tmp", "emptyDir": {}}
    # The other volume is the World Secret's, read-only (its URLs as files, review R9).
    assert container["volumeMounts"][1:] == [
        {"name": "treadle-world-files", "mountPath": "/var/run/treadle/world", "readOnly": True}
    ]
    assert [v["secret"]["secretName"] for v in pod["volumes"][1:]] == ["treadle-world"]
    assert pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod


def test_the_defaults_are_fresh_copies() -> None:
    """A manifest edited by a caller never changes the next one's defaults."""
    _pod()["containers"][0]["securityContext"]["capabilities"]["drop"].append("x")
    assert _pod()["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_only_the_explicit_fields_replace_the_security_context() -> None:
    pod = _pod(
        podSecurityContext={"runAsUser": 2000, "runAsNonRoot": True},
        containerSecurityContext={"readOnlyRootFilesystem": False},
    )
    assert pod["securityContext"] == {"runAsUser": 2000, "runAsNonRoot": True}
    assert pod["containers"][0]["securityContext"] == {"readOnlyRootFilesystem": False}


def test_a_named_service_account_is_used_with_its_token() -> None:
    pod = _pod(serviceAccountName="orders-workers")
    assert pod["serviceAccountName"] == "orders-workers"
    assert "automountServiceAccountToken" not in pod


@pytest.mark.parametrize(
    "name",
    ["TREADLE_DEPLOYMENT_ID", "TREADLE_WORLD", "TREADLE_DATABASE_URL", "TREADLE_NATS_URL",
     "TREADLE_DATABASE_URL_FILE", "TREADLE_NATS_URL_FILE"],
)  # fmt: skip
def test_env_naming_an_operator_variable_is_refused_naming_it(name: str) -> None:
    spec = WorkflowDeploymentSpec.model_validate(
        {"image": "i", "module": "m",
         "env": [{"name": "EXTRA", "value": "1"}, {"name": name, "value": "other-team-rev"}]}
    )  # fmt: skip
    problem = podsecurity.reserved_env(spec, manifests.operator_env(spec, "r"))
    assert problem is not None
    assert problem.startswith(f"spec.env[1] sets {name}, which the operator sets")


def test_other_env_is_accepted_even_treadle_tuning() -> None:
    """Only what the operator sets is reserved; TREADLE_LOG_LEVEL and the like stay the user's."""
    spec = WorkflowDeploymentSpec.model_validate(
        {"image": "i", "module": "m",
         "env": [{"name": "TREADLE_LOG_LEVEL", "value": "DEBUG"},
                 {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}
    )  # fmt: skip
    assert podsecurity.reserved_env(spec, manifests.operator_env(spec, "r")) is None


def test_an_env_entry_without_a_name_is_refused() -> None:
    spec = WorkflowDeploymentSpec.model_validate({"image": "i", "module": "m", "env": [{"x": 1}]})
    assert podsecurity.reserved_env(spec, manifests.operator_env(spec, "r")) == (
        "spec.env[0] has no name"
    )


def test_host_network_workers_declare_no_port() -> None:
    """On the node's network a declared port is a host port: one worker a node. Such
    workers declare none; the others declare the metrics port the PodMonitor scrapes."""
    (plain,) = _pod()["containers"]
    assert plain["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
    (on_host,) = _pod(template={"spec": {"hostNetwork": True}})["containers"]
    assert on_host["ports"] == []
