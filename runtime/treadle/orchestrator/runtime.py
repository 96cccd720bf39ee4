"""What every delivery handler shares in one worker process."""

from __future__ import annotations

import collections
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from treadle.orchestrator.spec8.singleflight import SingleFlight
from treadle.sdk import functions
from treadle.settings import Settings
from treadle.world import contract, messages

log = logging.getLogger("treadle.orchestrator")


class RecentKeys:
    """Keys this process sent recently (near-due re-arms go out once per key)."""

    def __init__(self, limit: int = 10_000) -> None:
        self._keys: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._limit = limit

    def first_time(self, key: str) -> bool:
        if key in self._keys:
            return False
        self.mark(key)
        return True

    def seen(self, key: str) -> bool:
        return key in self._keys

    def mark(self, key: str) -> None:
        """Record ``key``: call it once what the key stands for is done (a send that
        raised must not be marked, or no later delivery of this process retries it)."""
        self._keys[key] = None
        if len(self._keys) > self._limit:
            self._keys.popitem(last=False)


@dataclass
class Runtime:
    world: contract.World
    workflows: Mapping[str, functions.WorkflowFunction[Any, Any]]
    steps: Mapping[str, functions.StepFunction[Any, Any]]
    settings: Settings
    deployment_id: str
    # The slot this process last consumed per run (the no-op wake fast path).
    consumed: dict[str, int] = field(default_factory=dict)
    near_due_sent: RecentKeys = field(default_factory=RecentKeys)
    # Deliveries (message, delivery, start) whose re-send pass sent: once per delivery,
    # not again in its coalesced re-runs.
    resent_invocations: RecentKeys = field(default_factory=RecentKeys)
    # Spec 8 (seed 000): one running inline body per run:correlation id in this process.
    single_flight: SingleFlight = field(default_factory=SingleFlight)

    def wake_message(
        self, run_id: str, deployment_id: str | None, *, spec_version: int
    ) -> messages.OrchestratorMessage:
        """A wake for the run's orchestrator, stamped with the run's own spec version (the
        one its messages carry), never this worker's minted one (audit Bug 9, RO3)."""
        return messages.OrchestratorMessage(
            run_id=run_id,
            deployment_id=deployment_id,
            run_spec_version=spec_version,
        )


def step_key(run_id: str, step_id: str) -> str:
    """A step's one queue message, deduplicated under this key for its whole life."""
    return f"step:{run_id}:{step_id}"
