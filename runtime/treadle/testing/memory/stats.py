"""Counters of what the in-memory queue did, overall and per run (``backend.stats``).

The simulation reads them for its bounds (handoffs and deliveries per run) and
its reports. Only ``queue.MessageQueue`` bumps them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal, TypeAlias

Counter: TypeAlias = Literal[
    "sends",
    "deduplicated",
    "lost_sends",
    "deliveries",
    "redeliveries",
    "handoffs",
    "coalesced",
    "reruns",
    "lease_lapses",
    "dead_letters",
    "takeovers",
    "restart_releases",
]


@dataclass(slots=True)
class Counters:
    """``sends``: send calls (keyed duplicates and lost sends included); ``deduplicated``:
    keyed sends that found their key taken; ``lost_sends``: sends an interceptor lost;
    ``deliveries``: leases taken (a coalesced re-run is not one); ``redeliveries``: a
    message made due again counted as an attempt (Redeliver, a raise, a lapse, an
    abandon); ``handoffs``; ``coalesced``: messages folded into an in-flight holder;
    ``reruns``: coalesced re-runs of a holder's handler; ``lease_lapses``;
    ``dead_letters``; ``takeovers``: leases lapsed because their worker's heartbeat
    stopped (``treadle.world.liveness``); ``restart_releases``: leases released by a
    restart in place."""

    sends: int = 0
    deduplicated: int = 0
    lost_sends: int = 0
    deliveries: int = 0
    redeliveries: int = 0
    handoffs: int = 0
    coalesced: int = 0
    reruns: int = 0
    lease_lapses: int = 0
    dead_letters: int = 0
    takeovers: int = 0
    restart_releases: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(slots=True)
class QueueStats:
    """``total`` over every run, and ``per_run`` by run id (``of(run_id)``)."""

    total: Counters = field(default_factory=Counters)
    per_run: dict[str, Counters] = field(default_factory=dict)

    def of(self, run_id: str) -> Counters:
        """The counters of one run (zeros for a run the queue never saw)."""
        return self.per_run.get(run_id) or Counters()

    def bump(self, run_id: str, counter: Counter, by: int = 1) -> None:
        setattr(self.total, counter, getattr(self.total, counter) + by)
        run = self.per_run.get(run_id)
        if run is None:
            run = self.per_run[run_id] = Counters()
        setattr(run, counter, getattr(run, counter) + by)
