"""The World conformance suite run against the in-memory World (treadle.testing.memory)."""

from __future__ import annotations

import pytest

from treadle.testing.memory import MemoryBackend, MemoryWorld
from treadle.world import contract
from treadle.world.conformance import (
    changes,
    entity_reads,
    queue,
    queue_gating,
    queue_spec8,
    repin,
    storage,
    storage_spec8,
    storage_views,
)
from treadle.world.conformance.harness import WorldHarness


class MemoryHarness(WorldHarness):
    """Opens a MemoryWorld on one backend, so a reopen sees what the last one stored."""

    def __init__(self) -> None:
        self.backend = MemoryBackend()

    async def open(self, tuning: contract.QueueTuning | None = None) -> contract.World:
        return await MemoryWorld(self.backend, tuning=tuning).open()


@pytest.fixture
def harness() -> MemoryHarness:
    return MemoryHarness()


class TestMemoryStorage(storage.StorageConformance):
    pass


class TestMemoryEntityReads(entity_reads.EntityReadConformance):
    pass


class TestMemoryStorageViews(storage_views.StorageViewsConformance):
    pass


class TestMemoryQueue(queue.QueueConformance):
    pass


class TestMemoryQueueGating(queue_gating.QueueGatingConformance):
    pass


class TestMemoryChanges(changes.ChangesConformance):
    pass


class TestMemoryBacklog(changes.BacklogConformance):
    pass


class TestMemoryRepin(repin.RepinConformance):
    pass


class TestMemorySpec8Storage(storage_spec8.Spec8StorageConformance):
    pass


class TestMemorySpec8Queue(queue_spec8.Spec8QueueConformance):
    pass
