"""The World conformance suite: one set of tests every World must pass.

Use it by subclassing the suites in a test module and providing a ``harness``
fixture that opens the World under test::

    from treadle.world.conformance import harness, storage, queue

    class LocalHarness(harness.WorldHarness): ...

    @pytest.fixture
    def harness(tmp_path): return LocalHarness(tmp_path)

    class TestLocalStorage(storage.StorageConformance): pass
    class TestLocalQueue(queue.QueueConformance): pass

The suites import pytest, so this package is for tests only.
"""
