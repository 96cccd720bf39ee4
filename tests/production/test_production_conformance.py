"""The whole World conformance suite against Postgres storage + NATS JetStream queue."""

from __future__ import annotations

from treadle.world.conformance import changes, queue, queue_gating, repin, storage, storage_views


class TestProductionStorage(storage.StorageConformance):
    pass


class TestProductionStorageViews(storage_views.StorageViewsConformance):
    pass


class TestProductionQueue(queue.QueueConformance):
    pass


class TestProductionQueueGating(queue_gating.QueueGatingConformance):
    pass


class TestProductionChanges(changes.ChangesConformance):
    pass


class TestProductionBacklog(changes.BacklogConformance):
    backlog_deployment = "prod"  # the harness's queue consumes for it (conftest)


class TestProductionRepin(repin.RepinConformance):
    pass
