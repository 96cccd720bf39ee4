"""``MemoryWorld``: one process's view of an in-memory World, and its queue facade.

``MemoryWorld(backend=None, *, tuning=None, interceptor=None, name=None)`` is a
complete ``treadle.world.contract.World`` over a ``MemoryBackend`` (a new one
when none is given). Several MemoryWorlds over one backend are several
processes sharing one World: each has its own queue timings (``tuning``), its
own fault points (``interceptor``, see ``points``) and its own consumers; the
runs, logs, hooks, deployments and messages are the backend's.

``await world.open()`` returns the World (nothing to open); ``close()`` closes
its consumers and feed subscriptions and leaves the backend as it is, so a
MemoryWorld opened afterwards on the same backend sees everything (a restart).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from types import TracebackType

from treadle.testing.memory import points as fault_points
from treadle.testing.memory import storage
from treadle.testing.memory.backend import KeyedSend, MemoryBackend
from treadle.testing.memory.consumer import MemoryConsumer
from treadle.testing.memory.feed import MemoryChanges
from treadle.testing.memory.heartbeats import MemoryHeartbeats
from treadle.testing.memory.limits import MemoryLimits
from treadle.testing.memory.schedules import MemorySchedules
from treadle.testing.memory.streams import MemoryStreams
from treadle.world import contract, messages, queuerules

CAPABILITIES = contract.Capabilities(
    in_band_fence=True, serializes_runs=True, coalesces=True, live_feed=True
)
_WORLD_NUMBERS = itertools.count(1)


class MemoryQueue:
    """Sends into the backend's queue, and starts ``MemoryConsumer``s, for one World."""

    def __init__(
        self,
        backend: MemoryBackend,
        points: fault_points.Points,
        tuning: contract.QueueTuning,
        world: str,
    ) -> None:
        self._backend = backend
        self._points = points
        self.tuning = tuning
        self._world = world
        self.consumers: list[MemoryConsumer] = []

    async def send(
        self,
        message: messages.OrchestratorMessage | messages.StepMessage,
        *,
        key: str | None = None,
        delay_seconds: float = 0.0,
    ) -> messages.SendResult:
        (result,) = await self.send_batch([messages.Send(message, key, delay_seconds)])
        return result

    async def send_batch(self, sends: Sequence[messages.Send]) -> list[messages.SendResult]:
        prepared = [(send, queuerules.encode_send(send)) for send in sends]
        results: list[messages.SendResult] = []
        keyed: list[KeyedSend] = []
        for send, payload in prepared:
            run_id = send.message.run_id
            answer = await self._points.before("queue.send", run_id)
            results.append(self._backend.queue.send(send, payload, lose=answer == "lose"))
            if send.key is not None:
                keyed.append(KeyedSend(self._world, run_id, send.key))
                self._backend.keyed_sends.append(keyed[-1])
            if answer == "fail_after":
                raise fault_points.failed_after("queue.send", run_id)
        for sent in keyed:
            sent.ok = True  # the call returned: its sender may take every send as made
        return results

    async def consume(
        self,
        handlers: Mapping[messages.MessageKind, contract.Handler],
        *,
        concurrency: int = 32,
    ) -> contract.Consumer:
        return await self.consume_memory(handlers, concurrency=concurrency)

    async def backlog(self, kind: messages.MessageKind, deployment_id: str) -> int:
        """Due ``kind`` messages for ``deployment_id``, waiting or in flight."""
        return self._backend.queue.backlog(kind, deployment_id)

    async def consume_memory(
        self,
        handlers: Mapping[messages.MessageKind, contract.Handler],
        *,
        concurrency: int = 32,
    ) -> MemoryConsumer:
        """``consume``, typed as the ``MemoryConsumer`` it starts (which has ``kill()``)."""
        consumer = MemoryConsumer(
            self._backend.queue,
            dict(handlers),
            concurrency,
            tuning=self.tuning,
            points=self._points,
            world=self._world,
            name=f"{self._world}/consumer-{len(self.consumers) + 1}",
        )
        consumer.start()
        self.consumers.append(consumer)
        return consumer


class MemoryWorld:
    """An in-memory World (see the module docstring)."""

    capabilities = CAPABILITIES

    def __init__(
        self,
        backend: MemoryBackend | None = None,
        *,
        tuning: contract.QueueTuning | None = None,
        interceptor: fault_points.Interceptor | None = None,
        name: str | None = None,
    ) -> None:
        self.backend = backend if backend is not None else MemoryBackend()
        self.tuning = tuning or self.backend.tuning
        self.name = name or f"world-{next(_WORLD_NUMBERS)}"
        self.points = fault_points.Points(interceptor)
        self.memory_events = storage.MemoryEvents(self.backend, self.points)
        self.memory_queue = MemoryQueue(self.backend, self.points, self.tuning, self.name)
        self.runs: contract.Runs = storage.MemoryRuns(self.backend, self.points)
        self.events: contract.Events = self.memory_events
        self.steps: contract.Steps = storage.MemorySteps(self.backend, self.points)
        self.hooks: contract.Hooks = storage.MemoryHooks(self.backend, self.points)
        self.deployments: contract.Deployments = storage.MemoryDeployments(
            self.backend, self.points
        )
        self.queue: contract.Queue = self.memory_queue
        self.schedules: contract.Schedules = MemorySchedules(self.backend, self.points)
        self.heartbeats: contract.Heartbeats = MemoryHeartbeats(self.backend.heartbeats)
        self.memory_changes = MemoryChanges(self.backend.feeds)
        self.changes: contract.Changes = self.memory_changes
        self.limits: contract.LimitStore = MemoryLimits(self.backend.store, self.backend.limits)
        self.streams: contract.Streams = MemoryStreams(self.backend)  # issue 17 item 6
        self.closed = False

    async def open(self) -> MemoryWorld:
        self.closed = False
        return self

    @property
    def consumers(self) -> list[MemoryConsumer]:
        """The consumers started through this World (``queue.consume``)."""
        return list(self.memory_queue.consumers)

    def kill(self) -> None:
        """This process died: every consumer of it ``kill()``-ed (leases left to lapse).

        The caller cancels the process's own tasks; the backend keeps everything.
        """
        for consumer in self.memory_queue.consumers:
            consumer.kill()

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for consumer in list(self.memory_queue.consumers):
            await consumer.close(grace_seconds=0)
        self.memory_queue.consumers.clear()
        for sub in self.memory_events.subscriptions:
            sub.close()
        self.memory_events.subscriptions.clear()
        self.memory_changes.close()

    async def __aenter__(self) -> MemoryWorld:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"MemoryWorld({self.name!r}, {'closed' if self.closed else 'open'})"
