"""The World conformance suite run against the in-memory World (treadle.testing.memory)."""

from __future__ import annotations

import pytest

from treadle.testing.memory import MemoryBackend, MemoryWorld
from treadle.world import contract
from treadle.world.conformance import (
    attributes,
    changes,
    children,
    entity_reads,
    heartbeats,
    hook_claims,
    limits,
    outcome_attempts,
    queue,
    queue_gating,
    queue_spec8,
    repin,
    schedules,
    storage,
    storage_spec8,
    storage_views,
)
from treadle.world.conformance import streams as stream_conformance
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


class TestMemoryAttributes(attributes.AttributesConformance):
    pass


class TestMemoryChildLinks(children.ChildLinkConformance):  # child workflows
    pass


class TestMemorySpec8Storage(storage_spec8.Spec8StorageConformance):
    pass


class TestMemorySpec8Queue(queue_spec8.Spec8QueueConformance):
    pass


class TestMemorySchedules(schedules.SchedulesConformance):
    pass


class TestMemoryLimits(limits.LimitConformance):  # issue 17 item 4
    pass


class TestMemoryHeartbeats(heartbeats.HeartbeatsConformance):
    pass


class TestMemoryStreams(stream_conformance.StreamsConformance):  # issue 17 item 6
    pass


class TestMemoryHookClaims(hook_claims.HookClaimConformance):
    pass


class TestMemoryOutcomeAttempts(outcome_attempts.OutcomeAttemptConformance):  # issue 17 item 5
    pass
