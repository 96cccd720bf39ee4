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
    TREADLE_OPERATOR_TTL_CHECK_SECONDS: float = Field(
        default=10.0, gt=0, le=3600, description="how often finished runs' TTLs are checked"
    )
    TREADLE_OPERATOR_RETRY_SECONDS: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="delay before a WorkflowRun that cannot start yet is tried again",
    )
    TREADLE_OPERATOR_WORLD_HOSTS: str = Field(
        default="",
        description="comma-separated hosts (host or host:port, '*.suffix' for a domain) the "
        "operator may connect to as a World; empty: any (see docs/operator-security.md)",
    )
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
