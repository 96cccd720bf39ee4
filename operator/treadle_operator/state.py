"""What the operator holds while it runs: API client, World connections, status sync."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from treadle_operator.kube import Kube
from treadle_operator.settings import OperatorSettings
from treadle_operator.starts import Starts
from treadle_operator.sync import StatusSync
from treadle_operator.worlds import Worlds

# How long a mirrored WorkflowRun is kept after its run finished, unless its
# WorkflowDeployment says (``mirrorRunsTTLSecondsAfterFinished``): one day.
MIRROR_TTL_SECONDS = 86_400


@dataclass(frozen=True)
class Owner:
    """The WorkflowDeployment a revision belongs to."""

    namespace: str
    name: str
    mirror_runs: bool
    mirror_ttl_seconds: int = MIRROR_TTL_SECONDS  # a mirrored WorkflowRun's TTL


@dataclass(frozen=True)
class ScheduleOwner:
    """A WorkflowSchedule put in a World (``schedulesync``): the object as last reconciled
    and the revision its runs start on, so a run it fires is mirrored as it is created."""

    body: dict[str, Any]
    deployment_id: str | None


@dataclass
class State:
    settings: OperatorSettings
    kube: Kube
    worlds: Worlds
    sync: StatusSync
    owners: dict[str, Owner] = field(default_factory=dict)  # revision id -> its deployment
    namespaces: tuple[str, ...] = ()  # the namespaces served; empty: every namespace
    schedules: dict[str, ScheduleOwner] = field(default_factory=dict)  # World schedule name
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    starts: Starts = field(init=False)  # WorkflowRuns being started, with backoff

    def __post_init__(self) -> None:
        self.starts = Starts(
            self.settings.TREADLE_OPERATOR_RETRY_SECONDS,
            self.settings.TREADLE_OPERATOR_RETRY_MAX_SECONDS,
        )

    def lock(self, uid: str) -> asyncio.Lock:
        """One reconcile at a time per object (a timer and a change handler may overlap)."""
        return self._locks.setdefault(uid, asyncio.Lock())

    def forget(self, uid: str) -> None:
        """The object is gone: drop its lock (unless a reconcile holds it) and its start."""
        held = self._locks.get(uid)
        if held is not None and not held.locked():
            del self._locks[uid]
        self.starts.forget(uid)

    def lock_count(self) -> int:
        """How many objects' locks are held in memory (for the leak test)."""
        return len(self._locks)
