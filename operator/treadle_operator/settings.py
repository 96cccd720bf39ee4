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
    TREADLE_LOG_LEVEL: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
