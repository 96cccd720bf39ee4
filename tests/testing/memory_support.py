"""Helpers the in-memory World's unit tests share: a scripted interceptor, messages."""

from __future__ import annotations

import asyncio
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

    async def next(self) -> messages.DeliveryMeta:
        return await asyncio.wait_for(self._arrived.get(), WAIT)
