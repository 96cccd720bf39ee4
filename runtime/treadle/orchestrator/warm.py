"""Warm replay sessions: a suspended run's live replay, kept between its deliveries.

What Temporal calls a sticky cache (issue 15 item 5: "the cost of one delivery for a
run with 10,000 events", flat). A delivery that ends with its run suspended (waiting on
a hook, a wait or a background step) and everything it decided written hands its
session's live state to ``WarmRuns``: the ``Replay`` (the suspended workflow coroutine
and its indexes), the folded ``LogState``, the events it holds, the slot they end at
and the in-band count its writer held. The run's next delivery in this process takes
it (``RunSession.load(warm=True)``), reads only the log after that slot, and continues
from there, instead of loading the whole log and replaying the workflow from its start.

Continuity, or cold (``discontinuity``): the tail read's snapshot must show the same
in-band count (``seq_in_band``: nobody wrote in-band since, so no other orchestrator
delivery, in this process or another, decided anything) and a ``seq`` at or past the
kept slot; the new events must follow the kept slot without a gap, reach the
snapshot's ``seq``, and each be an out-of-band outcome the live replay folds as any
later event of a delivery (``FOLDABLE``: a background step's events, a hook payload, a
wake request). Anything else (an in-band event, a cancel or any terminal event, a
``run_repinned``, an event type this module does not name) drops the session and the
delivery loads and replays cold, exactly as without this module. The fence still
guards every write: the warm delivery's writer starts from the tail read's snapshot.
A session built on turbo's synthesized ``run_created`` (the start message's first
delivery reads no log) is continued only once the log's own slot 1 was read and found
equal to it (seed 003: a re-run of the first delivery loads the log, never the
synthesis); the tail is read under the read deadline, like every tail read.

A session is kept only from a clean suspension or a handoff at the end of the inline
window (``keepable``): the lease held, the writer never refused or failed, no run-ahead
speculation or event stash outstanding, no out-of-order event pending, the replay at
rest (``Replay.at_rest``: nothing it decided left unwritten, no divergence, no end),
the run not ended, on this deployment and spec 9. A
delivery takes its run's session out of the cache while it runs (a second delivery of
the run in this process meanwhile goes cold), and a run that ended, diverged, was
refused or failed keeps none.

Bounded (``TREADLE_WARM_RUNS`` sessions, ``TREADLE_WARM_EVENTS`` events held in all;
least recently kept evicted first; ``TREADLE_WARM_RUNS=0`` turns it off). ``STATS``
counts what happened, for the simulation's soak line and the tests.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from treadle.orchestrator.logstate import LogState
from treadle.replay import engine
from treadle.sdk import functions
from treadle.world import constants, events

if TYPE_CHECKING:
    from treadle.orchestrator.session import RunSession
    from treadle.settings import Settings

log = logging.getLogger("treadle.orchestrator.warm")

# The events a warm session folds from the new tail (each out-of-band): what other
# writers record between two orchestrator deliveries of a suspended run.
FOLDABLE: frozenset[str] = frozenset(
    {
        "step_started",
        "step_retrying",
        "step_completed",
        "step_failed",
        "hook_received",
        "wait_completed",
        "wake_requested",
    }
)


@dataclass
class WarmStats:
    """What the warm sessions of this process did (reset by nobody; read deltas)."""

    kept: int = 0
    resumed: int = 0
    evicted: int = 0
    events_folded: int = 0
    # Why a delivery that found a session went cold (``discontinuity``'s reasons).
    cold: collections.Counter[str] = field(default_factory=collections.Counter)


STATS = WarmStats()
# Run each time a delivery continues a warm session: the simulation's differential check
# against a cold replay (``testing.simulation.warmsessions.verify``); None in production.
VERIFY: Callable[[RunSession], None] | None = None


@dataclass(eq=False)
class WarmRun:
    """One suspended run's live replay and what it holds of the log."""

    run_id: str
    replay: engine.Replay
    state: LogState
    loaded: list[events.LoggedEvent]
    # The in-band count the log had at ``tail`` (the kept writer's count).
    seq_in_band: int
    workflow: functions.WorkflowFunction[Any, Any]
    deployment_id: str
    spec_version: int
    # Built on turbo's synthesized run_created: the log's slot 1 is read and compared first.
    synthesized: bool = False

    @property
    def tail(self) -> int:
        return len(self.loaded)

    def close(self) -> None:
        self.replay.close()


class WarmRuns:
    """The warm sessions of one worker process (one ``Runtime``), least recent first."""

    def __init__(self, runs: int, max_events: int) -> None:
        self.max_runs = max(runs, 0)
        self.max_events = max(max_events, 0)
        self._runs: collections.OrderedDict[str, WarmRun] = collections.OrderedDict()
        self.events = 0  # events held by every kept session

    @classmethod
    def from_settings(cls, settings: Settings) -> WarmRuns:
        return cls(settings.TREADLE_WARM_RUNS, settings.TREADLE_WARM_EVENTS)

    @property
    def enabled(self) -> bool:
        return self.max_runs > 0 and self.max_events > 0

    def __len__(self) -> int:
        return len(self._runs)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._runs

    def sessions(self) -> list[WarmRun]:
        """The kept sessions, least recently kept first (for checks; not taken)."""
        return list(self._runs.values())

    def take(self, run_id: str) -> WarmRun | None:
        """The run's session, out of the cache (the delivery owns it now), or None."""
        warm = self._runs.pop(run_id, None)
        if warm is not None:
            self.events -= warm.tail
        return warm

    def put(self, warm: WarmRun) -> None:
        """Keep ``warm``; evict the least recently kept past either bound."""
        if not self.enabled or warm.tail > self.max_events:
            warm.close()
            return
        older = self.take(warm.run_id)
        if older is not None and older is not warm:
            older.close()
        self._runs[warm.run_id] = warm
        self.events += warm.tail
        STATS.kept += 1
        while len(self._runs) > self.max_runs or self.events > self.max_events:
            run_id, oldest = self._runs.popitem(last=False)
            self.events -= oldest.tail
            oldest.close()
            STATS.evicted += 1
            log.debug("run %s: warm session evicted", run_id)

    def drop(self, run_id: str) -> None:
        warm = self.take(run_id)
        if warm is not None:
            warm.close()

    def clear(self) -> None:
        for run_id in list(self._runs):
            self.drop(run_id)


def discontinuity(
    warm: WarmRun, snapshot: events.Snapshot, new: Sequence[events.LoggedEvent]
) -> str | None:
    """Why the log after ``warm.tail`` (``new``, under ``snapshot``) cannot be folded
    into the kept session; None when it can."""
    if snapshot.seq < warm.tail:
        return "log_behind"
    if snapshot.seq_in_band != warm.seq_in_band:
        return "in_band_since"  # another orchestrator delivery wrote (or a stale count)
    expected = warm.tail + 1
    for logged in new:
        if logged.slot != expected:
            return "gap"
        expected += 1
        if logged.in_band:
            return "in_band_event"
        if logged.event.type not in FOLDABLE:
            return f"event:{logged.event.type}"
    if expected - 1 < snapshot.seq:
        return "short_read"
    return None


def keepable(session: RunSession) -> bool:
    """The session ended a delivery at a clean suspension (the module docstring)."""
    replay, writer, state = session.replay, session.writer, session.state
    return (
        replay is not None
        and writer is not None
        and not writer.stopped
        and not (session.lease_lost is not None and session.lease_lost.is_set())
        and replay.at_rest
        and session.confirmed is None
        and not session.has_stash
        and not session.has_pending
        and state.terminal is None
        and state.deployment_id == session.rt.deployment_id
        and state.spec_version == constants.SPEC_VERSION_SINGLE_ORCHESTRATOR
        and len(session.loaded) == session.tail == replay.log_tail
        and state.workflow_name in session.rt.workflows
    )


def keep(session: RunSession) -> bool:
    """Hand the session's live replay to the cache when ``keepable``; True if kept (the
    session then no longer holds it)."""
    cache = session.rt.warm
    if not cache.enabled or not keepable(session):
        return False
    replay, writer, state = session.replay, session.writer, session.state
    assert replay is not None
    assert writer is not None
    assert state.deployment_id is not None
    cache.put(
        WarmRun(
            run_id=session.run_id,
            replay=replay,
            state=state,
            loaded=session.loaded,
            seq_in_band=writer.expected,
            workflow=session.rt.workflows[state.workflow_name],
            deployment_id=state.deployment_id,
            spec_version=state.spec_version,
            synthesized=session.synthesized,
        )
    )
    session.replay = None
    return True


def usable(session: RunSession, warm: WarmRun) -> str | None:
    """Why a taken session does not fit this worker now (before any read); None if it does."""
    rt = session.rt
    if warm.deployment_id != rt.deployment_id:
        return "deployment"
    if rt.workflows.get(warm.state.workflow_name) is not warm.workflow:
        return "workflow"
    if warm.spec_version != constants.SPEC_VERSION_SINGLE_ORCHESTRATOR:
        return "spec"
    if warm.replay.closed or not warm.replay.at_rest:
        return "replay"
    return None
