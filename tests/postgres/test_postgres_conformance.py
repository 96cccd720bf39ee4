"""The World conformance suite's storage half run against the Postgres storage.

Each test gets its own migrated database (``conftest.pg_dsn``); a reopen (the
restart tests) connects a new ``PostgresStorage`` to the same database.
"""

from __future__ import annotations

from typing import cast

import pytest

from treadle.world import contract
from treadle.world.conformance import (
    attributes,
    changes,
    children,
    entity_reads,
    heartbeats,
    hook_claims,
    outcome_attempts,
    repin,
    schedules,
    storage,
    storage_spec8,
    storage_views,
)
from treadle.world.conformance import streams as stream_conformance
from treadle.world.conformance.harness import WorldHarness
from treadle.worlds.postgres import PostgresStorage

CAPABILITIES = contract.Capabilities(
    in_band_fence=True, serializes_runs=False, coalesces=False, live_feed=True
)


class PostgresStorageWorld:
    """The storage half as a World for the storage suites (no queue)."""

    capabilities = CAPABILITIES
    queue = None

    def __init__(self, storage: PostgresStorage) -> None:
        self.storage = storage
        self.runs = storage.runs
        self.events = storage.events
        self.steps = storage.steps
        self.hooks = storage.hooks
        self.deployments = storage.deployments
        self.changes = storage.changes
        self.schedules = storage.schedules
        self.heartbeats = storage.heartbeats
        self.streams = storage.streams  # issue 17 item 6

    async def close(self) -> None:
        await self.storage.close()


class PostgresHarness(WorldHarness):
    """Opens a PostgresStorage on one database, so a reopen sees what the last one stored."""

    def __init__(self, dsn: str, *, group_writes: bool = False) -> None:
        self.dsn = dsn
        self.group_writes = group_writes

    async def open(self, tuning: contract.QueueTuning | None = None) -> contract.World:
        storage = await PostgresStorage.connect(
            self.dsn, pool_size=4, group_writes=self.group_writes
        )
        return cast(contract.World, PostgresStorageWorld(storage))


@pytest.fixture(params=[False, True], ids=["alone", "grouped"])
def harness(pg_dsn: str, request: pytest.FixtureRequest) -> PostgresHarness:
    """Each suite twice: out-of-band writes alone, and through the write combiner."""
    return PostgresHarness(pg_dsn, group_writes=request.param)


class TestPostgresStorage(storage.StorageConformance):
    pass


class TestPostgresEntityReads(entity_reads.EntityReadConformance):
    pass


class TestPostgresStorageViews(storage_views.StorageViewsConformance):
    pass


class TestPostgresChanges(changes.ChangesConformance):
    pass


class TestPostgresRepin(repin.RepinConformance):
    pass


class TestPostgresAttributes(attributes.AttributesConformance):
    pass


class TestPostgresChildLinks(children.ChildLinkConformance):  # child workflows
    pass


class TestPostgresSpec8Storage(storage_spec8.Spec8StorageConformance):
    pass


class TestPostgresSchedules(schedules.SchedulesConformance):
    pass


class TestPostgresHeartbeats(heartbeats.HeartbeatsConformance):
    pass


class TestPostgresStreams(stream_conformance.StreamsConformance):  # issue 17 item 6
    pass


class TestPostgresHookClaims(hook_claims.HookClaimConformance):
    pass


class TestPostgresOutcomeAttempts(outcome_attempts.OutcomeAttemptConformance):  # issue 17 item 5
    pass
