"""The World conformance suite: one set of tests every World must pass.

Use it by subclassing the suites in a test module and providing a ``harness``
fixture that opens the World under test::

    from treadle.world.conformance import harness, queue, queue_gating, storage, storage_views

    class LocalHarness(harness.WorldHarness): ...

    @pytest.fixture
    def harness(tmp_path): return LocalHarness(tmp_path)

    class TestLocalStorage(storage.StorageConformance): pass
    class TestLocalStorageViews(storage_views.StorageViewsConformance): pass
    class TestLocalQueue(queue.QueueConformance): pass
    class TestLocalQueueGating(queue_gating.QueueGatingConformance): pass
    class TestLocalSpec8Storage(storage_spec8.Spec8StorageConformance): pass
    class TestLocalSpec8Queue(queue_spec8.Spec8QueueConformance): pass

The suites import pytest, so this package is for tests only.
"""

import pytest

# Failures in the suites show the values compared, as in a test module.
pytest.register_assert_rewrite(
    "treadle.world.conformance.storage",
    "treadle.world.conformance.support",
    "treadle.world.conformance.storage_views",
    "treadle.world.conformance.queue",
    "treadle.world.conformance.queue_gating",
    "treadle.world.conformance.changes",
    "treadle.world.conformance.storage_spec8",
    "treadle.world.conformance.queue_spec8",
    "treadle.world.conformance.attributes",
    "treadle.world.conformance.children",
    "treadle.world.conformance.schedules",
    "treadle.world.conformance.hook_claims",
    "treadle.world.conformance.outcome_attempts",
)
