"""Leader election settings (review R4, docs/operator-ha.md); the protocol itself runs
against the real API server in tests/k8s/test_operator_ha.py."""

from __future__ import annotations

import os
import re

import pytest

from treadle_operator import leader
from treadle_operator.errors import NotConfigured


def test_durations_must_nest_as_client_go_requires() -> None:
    """leaseDuration > renewDeadline > 1.2 x retryPeriod, else a one-line refusal."""
    leader.LeaseConfig(namespace="ns", name="l", identity="me")  # 15 > 10 > 2.4
    with pytest.raises(NotConfigured, match="leaseDuration > renewDeadline"):
        leader.LeaseConfig(namespace="ns", name="l", identity="me", lease_duration=10)
    with pytest.raises(NotConfigured, match=re.escape("got 15.0 s, 2 s, 2 s")):
        leader.LeaseConfig(
            namespace="ns", name="l", identity="me", renew_deadline=2, retry_period=2
        )


def test_identity_is_the_pod_name_else_host_and_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "treadle-operator-7d9-x2")
    assert leader.identity() == "treadle-operator-7d9-x2"
    monkeypatch.delenv("POD_NAME")
    assert leader.identity().endswith(f"-{os.getpid()}")


def test_the_lease_namespace_is_the_setting_else_the_pods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "treadle-system")
    assert leader.lease_namespace("ops") == "ops"
    assert leader.lease_namespace("") == "treadle-system"
    monkeypatch.delenv("POD_NAMESPACE")
    monkeypatch.setattr(leader, "SERVICE_ACCOUNT_NAMESPACE", "/nonexistent/namespace")
    assert leader.lease_namespace("") is None
