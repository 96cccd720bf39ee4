"""The operator's settings, from the environment (``TREADLE_OPERATOR_*``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class OperatorSettings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    TREADLE_OPERATOR_RECONCILE_SECONDS: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="how often a WorkflowDeployment's revisions are looked at again "
        "(readiness, draining); changes to the object are handled at once",
    )
    TREADLE_OPERATOR_SCHEDULE_SYNC_SECONDS: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="how often a WorkflowSchedule is put in its World again (a new revision) "
        "and its status, mirrors and history synced from there (runs it fires are also "
        "mirrored as the World reports them)",
    )
    TREADLE_OPERATOR_TTL_CHECK_SECONDS: float = Field(
        default=10.0, gt=0, le=3600, description="how often finished runs' TTLs are checked"
    )
    TREADLE_OPERATOR_RETRY_SECONDS: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="delay before a WorkflowRun that cannot start yet is tried again (the "
        "first; it doubles per try, up to TREADLE_OPERATOR_RETRY_MAX_SECONDS)",
    )
    TREADLE_OPERATOR_RETRY_MAX_SECONDS: float = Field(
        default=300.0,
        gt=0,
        le=86400,
        description="the longest delay between two tries at starting a WorkflowRun",
    )
    TREADLE_OPERATOR_SECRET_CACHE_SECONDS: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="how long a World Secret read is reused before it is read again (0: "
        "every time); a rotated Secret is seen within this",
    )
    TREADLE_OPERATOR_WORLD_HOSTS: str = Field(
        default="",
        description="comma-separated hosts (host or host:port, '*.suffix' for a domain) the "
        "operator may connect to as a World; empty: any (see docs/operator-security.md)",
    )
    TREADLE_OPERATOR_STATUS_INTERVAL_SECONDS: float = Field(
        default=1.0,
        ge=0,
        le=600,
        description="a WorkflowRun's status is patched at most this often, except a change "
        "of phase, which is patched at once (docs/operator-status-sync.md)",
    )
    TREADLE_OPERATOR_LEADER_ELECTION: bool = Field(
        default=True,
        description="run handlers only while holding a coordination.k8s.io Lease "
        "(docs/operator-ha.md); off, or without a namespace for the Lease, every process acts",
    )
    TREADLE_OPERATOR_LEASE_NAME: str = Field(default="treadle-operator", min_length=1)
    TREADLE_OPERATOR_LEASE_NAMESPACE: str = Field(
        default="", description="the Lease's namespace; default POD_NAMESPACE, else the pod's"
    )
    TREADLE_OPERATOR_LEASE_DURATION_SECONDS: float = Field(default=15.0, gt=0, le=3600)
    TREADLE_OPERATOR_RENEW_DEADLINE_SECONDS: float = Field(default=10.0, gt=0, le=3600)
    TREADLE_OPERATOR_RETRY_PERIOD_SECONDS: float = Field(default=2.0, gt=0, le=3600)
    TREADLE_OPERATOR_SIGNAL_TTL_SECONDS: int = Field(
        default=3600,
        ge=0,
        description="how long a handled WorkflowSignal is kept (its spec.ttlSecondsAfterHandled "
        "wins)",
    )
    TREADLE_OPERATOR_SIGNAL_DEADLINE_SECONDS: float = Field(
        default=600.0,
        gt=0,
        description="how long a WorkflowSignal that cannot be handled yet (World unreachable, "
        "run not started) is retried before it is Failed",
    )
    TREADLE_OPERATOR_PROBE_PORT: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="the port of /healthz, /readyz and /metrics (the chart sets 8080); 0: none",
    )
    TREADLE_OPERATOR_PROBE_HOST: str = Field(
        default="0.0.0.0", description="the address the probe and metrics server binds"
    )
    TREADLE_LOG_LEVEL: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # The validating admission webhook (treadle_operator.webhook, docs/operator-admission.md).
    TREADLE_OPERATOR_WEBHOOK: bool = Field(
        default=False, description="serve the WorkflowRun admission webhook (the chart: on)"
    )
    TREADLE_OPERATOR_WEBHOOK_ADDRESS: str = Field(
        default="0.0.0.0", description="the address the webhook server listens on"
    )
    TREADLE_OPERATOR_WEBHOOK_PORT: int = Field(default=9443, ge=1, le=65535)
    TREADLE_OPERATOR_WEBHOOK_HOSTS: str = Field(
        default="",
        description="comma-separated DNS names and IPs the serving certificate is for (the "
        "webhook Service's names); empty: localhost and 127.0.0.1",
    )
    TREADLE_OPERATOR_WEBHOOK_CONFIG: str = Field(
        default="",
        description="the ValidatingWebhookConfiguration whose caBundle the operator keeps "
        "equal to its CA; empty: none (the caBundle is provided otherwise)",
    )
    TREADLE_OPERATOR_WEBHOOK_SECRET: str = Field(
        default="",
        description="the Secret (in TREADLE_OPERATOR_WEBHOOK_NAMESPACE) holding the CA and "
        "serving certificate, shared by the operator's replicas; empty: kept in memory",
    )
    TREADLE_OPERATOR_WEBHOOK_NAMESPACE: str = Field(
        default="", description="the operator's own namespace (the chart: from the Pod)"
    )
    TREADLE_OPERATOR_WEBHOOK_BUNDLE_CHECK_SECONDS: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="how often the configuration's caBundle is checked (and put back)",
    )
    TREADLE_OPERATOR_INPUT_SECRETS: str = Field(
        default="",
        description="comma-separated Secret names spec.inputFrom.secretKeyRef may name (the "
        "chart's rbac.inputSecretNames); empty: none",
    )
