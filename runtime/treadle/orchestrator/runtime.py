"""What every delivery handler shares in one worker process."""

from __future__ import annotations

import collections
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from treadle.orchestrator.spec8.singleflight import SingleFlight
from treadle.orchestrator.warm import WarmRuns
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

    def forget(self, key: str) -> None:
        """Undo ``first_time`` for a key whose work failed (a later call may do it again)."""
        self._keys.pop(key, None)


# Runs whose last consumed slot a process remembers (the no-op wake's fast path): the
# most recently delivered ones; a run pushed out only loses the fast path (its next plain
# wake loads the log, as after a restart). About 100 bytes each: 1 MB at the cap.
CONSUMED_RUNS_REMEMBERED = 10_000


class ConsumedSlots:
    """The slot this process last consumed per run, for the most recent ``limit`` runs.

    A least-recently-delivered run is forgotten once more than ``limit`` are held, so a
    worker serving 100,000 runs holds ``limit`` entries, not one per run it ever served
    (issue 15 item 5: no growth that is not bounded). Reads and writes move a run to the
    front. The mapping operations the deliveries use: ``get`` and ``[run_id] = slot``.
    """

    def __init__(self, limit: int = CONSUMED_RUNS_REMEMBERED) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self._slots: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.limit = limit

    def get(self, run_id: str, default: int | None = None) -> int | None:
        slot = self._slots.get(run_id)
        if slot is None:
            return default
        self._slots.move_to_end(run_id)
        return slot

    def __setitem__(self, run_id: str, slot: int) -> None:
        self._slots[run_id] = slot
        self._slots.move_to_end(run_id)
        while len(self._slots) > self.limit:
            self._slots.popitem(last=False)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._slots

    def __len__(self) -> int:
        return len(self._slots)

    def forget(self, run_id: str) -> None:
        self._slots.pop(run_id, None)


@dataclass
class Runtime:
    world: contract.World
    workflows: Mapping[str, functions.WorkflowFunction[Any, Any]]
    steps: Mapping[str, functions.StepFunction[Any, Any]]
    settings: Settings
    deployment_id: str
    # The slot this process last consumed per run (the no-op wake fast path), bounded.
    consumed: ConsumedSlots = field(default_factory=ConsumedSlots)
    near_due_sent: RecentKeys = field(default_factory=RecentKeys)
    # Deliveries (message, delivery, start) whose re-send pass sent: once per delivery,
    # not again in its coalesced re-runs.
    resent_invocations: RecentKeys = field(default_factory=RecentKeys)
    # Spec 8 (seed 000): one running inline body per run:correlation id in this process.
    single_flight: SingleFlight = field(default_factory=SingleFlight)
    # Suspended runs' live replays, kept for their next delivery (``orchestrator.warm``),
    # bounded by TREADLE_WARM_RUNS and TREADLE_WARM_EVENTS.
    warm: WarmRuns = field(init=False)
    # Concurrency and rate limits (``limitgate``): runs this process saw admitted (a
    # limited run holds its slot for its life), and runs of workflows with no limit.
    limit_admitted: RecentKeys = field(default_factory=RecentKeys)
    limit_free: RecentKeys = field(default_factory=RecentKeys)

    def __post_init__(self) -> None:
        self.warm = WarmRuns.from_settings(self.settings)

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
