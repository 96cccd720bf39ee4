"""Helpers the in-memory World's unit tests share: a scripted interceptor, messages."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime

from treadle.testing.memory import Interference
from treadle.world import constants, contract, ids, messages

FAST = contract.QueueTuning(lease_seconds=0.3, backoff_base_seconds=0.05, backoff_max_seconds=0.1)
WAIT = 10.0


def step_message(run_id: str | None = None, step_id: str = "s1") -> messages.StepMessage:
    return messages.StepMessage(
        run_id=run_id or ids.new_run_id(),
        step_id=step_id,
        step_name="add",
        run_context=messages.RunContext(
            spec_version=constants.SPEC_VERSION_SINGLE_ORCHESTRATOR, workflow_name="wf"
        ),
        step_created_at=datetime.now(UTC),
    )


def orchestrator_message(run_id: str) -> messages.OrchestratorMessage:
    return messages.OrchestratorMessage(
        run_id=run_id, run_spec_version=constants.SPEC_VERSION_SINGLE_ORCHESTRATOR
    )


Answer = Interference | Exception | asyncio.Event


@dataclass
class Scripted:
    """An interceptor answering from a script per point (then "proceed"), recording calls.

    An Exception in the script is raised; an asyncio.Event blocks the call until set.
    """

    script: dict[str, list[Answer]] = field(default_factory=dict)
    seen: list[tuple[str, str | None]] = field(default_factory=list)

    async def before(self, point: str, run_id: str | None) -> Interference:
        self.seen.append((point, run_id))
        answers = self.script.get(point)
        answer: Answer = answers.pop(0) if answers else "proceed"
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, asyncio.Event):
            await answer.wait()
            return "proceed"
        return answer

    def points(self) -> set[str]:
        return {point for point, _ in self.seen}


class Deliveries:
    """A handler recording (message, meta); it runs ``body`` first if one is given."""

    def __init__(self) -> None:
        self.calls: list[tuple[messages.OrchestratorMessage | messages.StepMessage,
                               messages.DeliveryMeta]] = []  # fmt: skip
        self._arrived: asyncio.Queue[messages.DeliveryMeta] = asyncio.Queue()
        self.release = asyncio.Event()
        self.hold = False

    async def __call__(
        self,
        message: messages.OrchestratorMessage | messages.StepMessage,
        meta: messages.DeliveryMeta,
    ) -> messages.HandlerResult:
        self.calls.append((message, meta))
        self._arrived.put_nowait(meta)
        if self.hold and meta.delivery_count == 1:
            await self.release.wait()
        return messages.ACK

    async def next(self, timeout: float = WAIT) -> messages.DeliveryMeta:
        return await asyncio.wait_for(self._arrived.get(), timeout)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A loop whose time jumps to the next timer when nothing is ready (a test's small
    stand-in for the simulation's loop): sleeps, leases and delays pass at once."""

    def __init__(self) -> None:
        super().__init__()
        self.vtime = 0.0
        self.iterations = 0
        select = self._selector.select  # type: ignore[attr-defined]

        def virtual_select(timeout: float | None = None) -> object:
            # Called with timeout 0 while callbacks are ready: time moves only when none is,
            # and then to the next timer exactly (as the simulation's loop does).
            self.iterations += 1
            ready = select(0)
            scheduled = self._scheduled  # type: ignore[attr-defined]
            if not ready and timeout and scheduled:
                self.vtime = max(self.vtime, scheduled[0].when())
            return ready

        self._selector.select = virtual_select  # type: ignore[attr-defined]

    def time(self) -> float:
        return self.vtime


class VirtualClock:
    """``treadle.clock.Clock`` on a VirtualTimeLoop, its monotonic time on another origin
    than the loop's (as the simulation's is), its random bytes seeded."""

    def __init__(self, loop: VirtualTimeLoop, seed: int) -> None:
        self.loop = loop
        self.rng = random.Random(seed)

    def time(self) -> float:
        return 1_780_000_000.0 + self.loop.time()

    def monotonic(self) -> float:
        return 1000.0 + self.loop.time()

    def random_bytes(self, n: int) -> bytes:
        return self.rng.randbytes(n)
