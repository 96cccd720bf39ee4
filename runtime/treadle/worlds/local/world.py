"""``LocalWorld``: the embedded World, storage and queue in one SQLite file.

``LocalWorld.open(path)`` (or ``async with LocalWorld(path)``) creates or opens
the World under the directory ``path``; one process at a time may hold it.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

from treadle.world import contract, records
from treadle.worlds.local import queue, storage
from treadle.worlds.local.database import Database
from treadle.worlds.local.feed import Feed
from treadle.worlds.local.heartbeats import LocalHeartbeats
from treadle.worlds.local.limits import LocalLimits
from treadle.worlds.local.schedules import LocalSchedules
from treadle.worlds.local.streams import LocalStreams

CAPABILITIES = contract.Capabilities(
    in_band_fence=True, serializes_runs=True, coalesces=True, live_feed=True
)


class LocalWorld:
    """The embedded World. Construct, then ``await world.open()`` (or ``async with``)."""

    capabilities = CAPABILITIES

    def __init__(self, path: str | Path, *, tuning: contract.QueueTuning | None = None) -> None:
        self.path = Path(path)
        self.tuning = tuning or contract.QueueTuning()
        self._db: Database | None = None

    async def open(self) -> LocalWorld:
        if self._db is not None:
            return self
        db = await Database.open(self.path)
        self._db = db
        self.feed = Feed(self._list_page, db.external_writes)
        self.runs: contract.Runs = storage.LocalRuns(db, self.feed)
        self.events: contract.Events = storage.LocalEvents(db, self.feed)
        self.steps: contract.Steps = storage.LocalSteps(db)
        self.hooks: contract.Hooks = storage.LocalHooks(db)
        self.deployments: contract.Deployments = storage.LocalDeployments(db)
        self.heartbeats: contract.Heartbeats = LocalHeartbeats(db)  # step heartbeats
        self.local_queue = queue.LocalQueue(db, self.tuning)
        self.queue: contract.Queue = self.local_queue
        self.changes: contract.Changes = self.feed
        self.schedules: contract.Schedules = LocalSchedules(db)  # issue 17 item 3
        self.limits: contract.LimitStore = LocalLimits(db)
        self.streams: contract.Streams = LocalStreams(db)  # issue 17 item 6
        return self

    async def _list_page(self, run_id: str, after_slot: int) -> records.EventPage:
        return await self.events.list(run_id, after_slot=after_slot)

    async def close(self) -> None:
        if self._db is None:
            return
        for consumer in list(self.local_queue.consumers):
            await consumer.close(grace_seconds=0)
        self.feed.close()
        db, self._db = self._db, None
        await db.close()

    async def __aenter__(self) -> LocalWorld:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "open" if self._db is not None else "closed"
        return f"LocalWorld({str(self.path)!r}, {state})"
