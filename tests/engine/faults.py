"""A fault-injecting World for the edge-case tests (EDGE-CASES.md names it for A2).

It wraps a real ``LocalWorld`` and forwards everything, except where a test
arms a fault: refuse in-band writes with ``InBandSuperseded``, or fail queue
sends with a ``ConnectionError``, for the next ``times`` calls that match. It
also records every handler answer, so a test can assert Redeliver / Handoff.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from treadle import errors
from treadle.world import contract, events, messages, records


@dataclass
class Fault:
    matches: Callable[..., bool]
    times: int

    def hit(self, *args: Any) -> bool:
        if self.times != 0 and self.matches(*args):
            self.times -= 1
            return True
        return False


@dataclass
class Answer:
    kind: str
    meta: messages.DeliveryMeta
    result: messages.HandlerResult | None
    error: BaseException | None


class FaultyEvents:
    def __init__(self, inner: contract.Events) -> None:
        self._inner = inner
        self.refusals: list[Fault] = []

    def refuse_in_band(self, times: int = 1, when: Callable[..., bool] = lambda e: True) -> None:
        """Refuse the next ``times`` in-band writes whose (first) event matches; -1 = always."""
        self.refusals.append(Fault(when, times))

    def _refused(
        self, run_id: str, event: events.Event, in_band: bool, expected: int | None
    ) -> None:
        if in_band and any(f.hit(event) for f in self.refusals):
            raise errors.InBandSuperseded(
                run_id, expected_seq_in_band=expected or 0, seq_in_band=(expected or 0) + 1
            )

    async def create(self, run_id: str, event: events.Event, **kw: Any) -> records.EventResult:
        self._refused(run_id, event, kw.get("in_band", False), kw.get("expected_seq_in_band"))
        return await self._inner.create(run_id, event, **kw)

    async def create_batch(
        self, run_id: str, batch: Sequence[events.Event], **kw: Any
    ) -> records.BatchResult:
        self._refused(run_id, batch[0], kw.get("in_band", False), kw.get("expected_seq_in_band"))
        return await self._inner.create_batch(run_id, batch, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class FaultyQueue:
    def __init__(self, inner: contract.Queue) -> None:
        self._inner = inner
        self.send_faults: list[Fault] = []
        self.sent: list[messages.Send] = []
        self.answers: list[Answer] = []

    def fail_sends(self, times: int = 1, when: Callable[..., bool] = lambda s: True) -> None:
        self.send_faults.append(Fault(when, times))

    async def send(
        self, message: Any, *, key: str | None = None, delay_seconds: float = 0.0
    ) -> Any:
        (result,) = await self.send_batch([messages.Send(message, key, delay_seconds)])
        return result

    async def send_batch(self, sends: Sequence[messages.Send]) -> list[messages.SendResult]:
        for send in sends:
            if any(f.hit(send) for f in self.send_faults):
                raise ConnectionError(f"injected: send of {send.key or send.message.kind} failed")
        self.sent.extend(sends)
        return await self._inner.send_batch(sends)

    async def consume(
        self, handlers: Mapping[messages.MessageKind, contract.Handler], *, concurrency: int = 32
    ) -> contract.Consumer:
        def spy(kind: str, handler: contract.Handler) -> contract.Handler:
            async def recorded(message: Any, meta: messages.DeliveryMeta) -> Any:
                try:
                    result = await handler(message, meta)
                except Exception as exc:
                    self.answers.append(Answer(kind, meta, None, exc))
                    raise
                self.answers.append(Answer(kind, meta, result, None))
                return result

            return recorded

        wrapped = {kind: spy(kind, h) for kind, h in handlers.items()}
        return await self._inner.consume(wrapped, concurrency=concurrency)

    def orchestrator_answers(self) -> list[Answer]:
        return [a for a in self.answers if a.kind == "orchestrator"]


@dataclass
class FaultyWorld:
    inner: Any
    capabilities: contract.Capabilities = field(init=False)

    def __post_init__(self) -> None:
        self.capabilities = self.inner.capabilities
        self.events = FaultyEvents(self.inner.events)
        self.queue = FaultyQueue(self.inner.queue)
        self.runs = self.inner.runs
        self.steps = self.inner.steps
        self.hooks = self.inner.hooks
        self.deployments = self.inner.deployments

    async def close(self) -> None:
        await self.inner.close()
