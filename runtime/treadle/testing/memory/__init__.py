"""An in-memory World: the whole World contract on one asyncio loop, nothing on disk.

``MemoryWorld()`` alone is a complete, fast World for tests. For the simulation,
one ``MemoryBackend`` holds the shared state and each simulated process gets its
own ``MemoryWorld(backend, tuning=..., interceptor=..., name=...)``; the backend's
plain methods (``in_flight``, ``queued``, ``next_due``, ``stats``, ``events_of``,
``force_lease_lapse``, ``drop_feeds``) and ``MemoryConsumer.kill()`` are the
simulation's controls. Every time read goes through ``treadle.clock`` and every
delay is an asyncio timer, so a virtual-time loop runs it without waiting.

Modules: ``backend`` (shared state, controls), ``world`` (a process's World and
queue), ``storage`` (the storage facades), ``log`` (storage rules), ``queue``
(queue rules), ``consumer`` (deliveries), ``feed`` (live feed), ``points`` (the
interceptor's fault points), ``stats`` (queue counters).
"""

from treadle.testing.memory.backend import MemoryBackend
from treadle.testing.memory.consumer import MemoryConsumer
from treadle.testing.memory.points import POINTS, Interceptor, Interference
from treadle.testing.memory.queue import DeadLetter, InFlight
from treadle.testing.memory.stats import Counters, QueueStats
from treadle.testing.memory.world import MemoryQueue, MemoryWorld

__all__ = [
    "POINTS",
    "Counters",
    "DeadLetter",
    "InFlight",
    "Interceptor",
    "Interference",
    "MemoryBackend",
    "MemoryConsumer",
    "MemoryQueue",
    "MemoryWorld",
    "QueueStats",
]
