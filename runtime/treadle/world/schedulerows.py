"""How a World stores a schedule (issue 17 item 3): the spec as one JSON text, the state
as columns, times as microseconds since the epoch (local) or timestamptz (Postgres).
Shared by the local and Postgres Worlds' schedules tables."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from datetime import UTC, datetime
from typing import Any

from treadle import errors
from treadle.world import records


class SchedulePuts(ABC):
    """``put`` and ``put_if`` of the Schedules contract, for every World: one write,
    ``_put``, that compares the stored version first when ``expected_version`` is given
    (0: no schedule of that name yet) and returns None when it differs."""

    async def put(
        self, spec: records.ScheduleSpec, *, next_fire_at: datetime | None
    ) -> records.ScheduleRecord:
        made = await self._put(spec, next_fire_at, None)
        assert made is not None  # no expected version: the write always lands
        return made

    async def put_if(
        self, spec: records.ScheduleSpec, *, next_fire_at: datetime | None, expected_version: int
    ) -> records.ScheduleRecord | None:
        return await self._put(spec, next_fire_at, expected_version)

    @abstractmethod
    async def _put(
        self,
        spec: records.ScheduleSpec,
        next_fire_at: datetime | None,
        expected_version: int | None,
    ) -> records.ScheduleRecord | None: ...


def spec_json(spec: records.ScheduleSpec) -> str:
    data: dict[str, Any] = {
        "workflow_name": spec.workflow_name,
        "cron": spec.cron,
        "timezone": spec.timezone,
        "overlap": spec.overlap,
        "catchup_window_seconds": spec.catchup_window_seconds,
        "input": spec.input,
    }
    # Written only when not the default, so a spec stored before they existed (or by an
    # older treadle) reads the same: no schema change (the spec is one JSON text).
    if spec.deployment_id is not None:
        data["deployment_id"] = spec.deployment_id
    if spec.catchup != "all":
        data["catchup"] = spec.catchup
    return json.dumps(data, separators=(",", ":"))


def spec_from(name: str, text: str | dict[str, Any], paused: bool) -> records.ScheduleSpec:
    data = json.loads(text) if isinstance(text, str) else text
    overlap = data.get("overlap")
    if overlap not in records.SCHEDULE_OVERLAPS:
        raise errors.IncompatibleStorage(f"schedule {name}: stored overlap {overlap!r} is unknown")
    catchup = data.get("catchup", "all")
    if catchup not in records.SCHEDULE_CATCHUPS:
        raise errors.IncompatibleStorage(f"schedule {name}: stored catchup {catchup!r} is unknown")
    deployment = data.get("deployment_id")
    return records.ScheduleSpec(
        name=name,
        workflow_name=str(data["workflow_name"]),
        cron=str(data["cron"]),
        timezone=str(data["timezone"]),
        overlap=overlap,
        catchup_window_seconds=float(data["catchup_window_seconds"]),
        input=data.get("input"),
        paused=paused,
        deployment_id=None if deployment is None else str(deployment),
        catchup=catchup,
    )


def to_us(value: datetime | None) -> int | None:
    if value is None:
        return None
    delta = value.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(value: int | None) -> datetime | None:
    if value is None:
        return None
    return datetime.fromtimestamp(value // 1_000_000, UTC).replace(microsecond=value % 1_000_000)
