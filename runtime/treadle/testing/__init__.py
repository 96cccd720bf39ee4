"""Tools for testing workflows, and treadle itself, without servers or waiting.

- ``treadle.testing.memory``: an in-memory World that implements the whole World
  contract (it passes ``treadle.world.conformance``). ``MemoryWorld()`` is a fast
  World for tests: ``Workflows(world=MemoryWorld(), worker=True)`` runs an app on
  one event loop, with nothing on disk. Under a virtual-time event loop its delays,
  leases and backoffs pass at once.
- ``treadle.testing.simulation``: the deterministic simulation that runs the real
  orchestrator on memory Worlds under seeded faults and checks invariants.
"""
