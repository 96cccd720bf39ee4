"""Step heartbeats in the memory World (issue 17 item 5): the backend's dict, shared by
every simulated process of one World, so a next attempt elsewhere sees the last beat."""

from __future__ import annotations

from datetime import datetime

from pydantic import JsonValue

from treadle.world import records


class MemoryHeartbeats:
    def __init__(self, beats: dict[tuple[str, str], records.HeartbeatRecord]) -> None:
        self._beats = beats

    async def record(
        self, run_id: str, step_id: str, *, attempt: int, details: JsonValue, beat_at: datetime
    ) -> None:
        held = self._beats.get((run_id, step_id))
        if held is not None and held.attempt > attempt:
            return  # a late beat of an older attempt
        self._beats[(run_id, step_id)] = records.HeartbeatRecord(
            run_id, step_id, attempt, details, beat_at
        )

    async def get(self, run_id: str, step_id: str) -> records.HeartbeatRecord | None:
        return self._beats.get((run_id, step_id))
