"""The in-memory World's schedules table (``contract.Schedules``), on the backend's dict.

Each call is synchronous on the loop once its fault point is passed, so a compare-and-set
is atomic; reads return the stored (frozen) records. Built by ``world.MemoryWorld``.

Every write is recorded, in order, in ``MemoryBackend.schedule_writes`` (put or update,
the record before it, or None, and after it: the simulation's schedule invariants read the
history). A won compare-and-set (a claim) passes one more fault point after it
committed, ``schedules.claimed``: a process killed there dies between a claim and its
run's start, the window the claim's ``last_run_id`` repairs (docs/schedules.md).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING

from treadle import clock, errors
from treadle.testing.memory import points as fault_points
from treadle.world import records
from treadle.world.schedulerows import SchedulePuts

if TYPE_CHECKING:
    from treadle.testing.memory.backend import MemoryBackend


class MemorySchedules(SchedulePuts):
    def __init__(self, backend: MemoryBackend, points: fault_points.Points) -> None:
        self._backend = backend
        self._points = points

    async def _enter(self, point: str) -> bool:
        return await self._points.before(point, None) == "fail_after"

    def _leave(self, fail: bool, point: str) -> None:
        if fail:
            raise fault_points.failed_after(point, None)

    async def _put(
        self,
        spec: records.ScheduleSpec,
        next_fire_at: datetime | None,
        expected_version: int | None,
    ) -> records.ScheduleRecord | None:
        fail = await self._enter("schedules.put")
        now = clock.utcnow()
        held = self._backend.schedules.get(spec.name)
        if expected_version is not None and expected_version != (held.version if held else 0):
            self._leave(fail, "schedules.put")
            return None
        if held is None:
            state = records.ScheduleState(paused=spec.paused, next_fire_at=next_fire_at)
            record = records.ScheduleRecord(spec, state, 1, now, now)
        else:
            state = dataclasses.replace(held.state, paused=spec.paused, next_fire_at=next_fire_at)
            record = records.ScheduleRecord(spec, state, held.version + 1, held.created_at, now)
        self._backend.schedules[spec.name] = record
        self._backend.schedule_writes.append(("put", held, record))
        self._leave(fail, "schedules.put")
        return record

    async def get(self, name: str) -> records.ScheduleRecord:
        fail = await self._enter("schedules.get")
        held = self._backend.schedules.get(name)
        if held is None:
            raise errors.ScheduleNotFound(name)
        self._leave(fail, "schedules.get")
        return held

    async def list(self, *, limit: int = 1000) -> list[records.ScheduleRecord]:
        fail = await self._enter("schedules.list")
        found = [self._backend.schedules[n] for n in sorted(self._backend.schedules)][:limit]
        self._leave(fail, "schedules.list")
        return found

    async def update(
        self, name: str, *, expected_version: int, state: records.ScheduleState
    ) -> records.ScheduleRecord | None:
        fail = await self._enter("schedules.update")
        held = self._backend.schedules.get(name)
        record = None
        if held is not None and held.version == expected_version:
            record = dataclasses.replace(
                held, state=state, version=held.version + 1, updated_at=clock.utcnow()
            )
            self._backend.schedules[name] = record
            self._backend.schedule_writes.append(("update", held, record))
            await self._points.before("schedules.claimed", None)  # a death after the claim
        self._leave(fail, "schedules.update")
        return record

    async def delete(self, name: str) -> bool:
        fail = await self._enter("schedules.delete")
        gone = self._backend.schedules.pop(name, None) is not None
        self._leave(fail, "schedules.delete")
        return gone
