"""The World conformance suite run against the local World (SQLite log and queue)."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    queue_leases,
    queue_spec8,
    repin,
    schedules,
    storage,
    storage_spec8,
    storage_views,
)
from treadle.world.conformance import streams as stream_conformance
from treadle.world.conformance.harness import WorldHarness
from treadle.worlds.local import LocalWorld


class LocalHarness(WorldHarness):
    """Opens a LocalWorld on one directory, so a reopen sees what the last one stored."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def open(self, tuning: contract.QueueTuning | None = None) -> contract.World:
        return await LocalWorld(self.path, tuning=tuning).open()


@pytest.fixture
def harness(tmp_path: Path) -> LocalHarness:
    return LocalHarness(tmp_path / "world")


class TestLocalStorage(storage.StorageConformance):
    pass


class TestLocalEntityReads(entity_reads.EntityReadConformance):
    pass


class TestLocalStorageViews(storage_views.StorageViewsConformance):
    pass


class TestLocalQueue(queue.QueueConformance):
    pass


class TestLocalQueueGating(queue_gating.QueueGatingConformance):
    pass


class TestLocalQueueLeases(queue_leases.QueueLeaseConformance):
    pass


class TestLocalChanges(changes.ChangesConformance):
    pass


class TestLocalBacklog(changes.BacklogConformance):
    pass


class TestLocalRepin(repin.RepinConformance):
    pass


class TestLocalAttributes(attributes.AttributesConformance):
    pass


class TestLocalChildLinks(children.ChildLinkConformance):  # child workflows
    pass


class TestLocalSpec8Storage(storage_spec8.Spec8StorageConformance):
    pass


class TestLocalSpec8Queue(queue_spec8.Spec8QueueConformance):
    pass


class TestLocalSchedules(schedules.SchedulesConformance):
    pass


class TestLocalLimits(limits.LimitConformance):  # issue 17 item 4
    pass


class TestLocalHeartbeats(heartbeats.HeartbeatsConformance):
    pass


class TestLocalStreams(stream_conformance.StreamsConformance):  # issue 17 item 6
    pass


class TestLocalHookClaims(hook_claims.HookClaimConformance):
    pass


class TestLocalOutcomeAttempts(outcome_attempts.OutcomeAttemptConformance):  # issue 17 item 5
    pass
