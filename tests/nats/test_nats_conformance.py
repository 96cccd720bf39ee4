"""The queue conformance suites, unchanged, against ``NatsQueue`` on a real nats-server.

Seed 003 "Spec 9 queue rules", "The dedupe contract" and "Queue: one
orchestrator delivery per run", as pinned by ``treadle.world.conformance``; the
harness (``conftest.NatsHarness``) gives each test its own stream.
"""

from __future__ import annotations

from treadle.world.conformance import changes, queue, queue_gating, queue_leases, queue_spec8


class TestNatsQueue(queue.QueueConformance):
    pass


class TestNatsQueueGating(queue_gating.QueueGatingConformance):
    pass


class TestNatsQueueLeases(queue_leases.QueueLeaseConformance):
    pass


class TestNatsBacklog(changes.BacklogConformance):
    pass


class TestNatsSpec8Queue(queue_spec8.Spec8QueueConformance):
    pass
