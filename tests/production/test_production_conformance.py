"""The whole World conformance suite against Postgres storage + NATS JetStream queue."""

from __future__ import annotations

from treadle.world.conformance import (
    attributes,
    changes,
    children,
    hook_claims,
    limits,
    outcome_attempts,
    queue,
    queue_gating,
    repin,
    storage,
    storage_views,
)
from treadle.world.conformance import streams as stream_conformance


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


class TestProductionAttributes(attributes.AttributesConformance):
    pass


class TestProductionChildLinks(children.ChildLinkConformance):  # child workflows
    pass


class TestProductionLimits(limits.LimitConformance):  # issue 17 item 4
    pass


class TestProductionStreams(stream_conformance.StreamsConformance):  # issue 17 item 6
    pass


class TestProductionHookClaims(hook_claims.HookClaimConformance):
    pass


class TestProductionOutcomeAttempts(outcome_attempts.OutcomeAttemptConformance):  # issue 17 item 5
    pass
