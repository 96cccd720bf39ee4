"""The warm-session cache's own rules (``treadle.orchestrator.warm``): which tails a kept
session may fold, and the bounds (runs, events), least recently kept evicted first.
The end-to-end behaviour on real Worlds is tests/engine/test_warm_sessions.py."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from treadle import settings
from treadle.orchestrator import warm
from treadle.orchestrator.logstate import LogState
from treadle.replay import engine
from treadle.sdk import functions
from treadle.world import events, ids

AT = datetime(2026, 12, 2, tzinfo=UTC)


async def _forever() -> None:
    """A workflow that never ends: its replay stays suspended until closed."""
    await asyncio.get_running_loop().create_future()


WORKFLOW: functions.WorkflowFunction[Any, Any] = functions.WorkflowFunction(
    _forever, name="forever"
)


def _logged(slot: int, event: events.Event, *, in_band: bool = False) -> events.LoggedEvent:
    return events.LoggedEvent(
        run_id=_id("one"), slot=slot, created_at=AT, in_band=in_band, event=event
    )


RUN_IDS: dict[str, str] = {}


def _id(name: str) -> str:
    return RUN_IDS.setdefault(name, ids.new_run_id())


def _kept(name: str, size: int, seq_in_band: int = 3) -> warm.WarmRun:
    run_id = _id(name)
    replay = engine.Replay(
        run_id=run_id, workflow_name="forever", workflow=_forever, args=[], kwargs={}
    )
    loaded = [_logged(i + 1, events.RunStarted(), in_band=True) for i in range(size)]
    return warm.WarmRun(
        run_id=run_id, replay=replay, state=LogState(run_id), loaded=loaded,
        seq_in_band=seq_in_band, workflow=WORKFLOW, deployment_id="d", spec_version=9,
    )  # fmt: skip


def _received(slot: int, *, in_band: bool = False) -> events.LoggedEvent:
    return _logged(slot, events.HookReceived(correlation_id="hook_1", payload=1), in_band=in_band)


def test_a_tail_of_out_of_band_outcomes_continues_the_session() -> None:
    kept = _kept("one", 5)
    snapshot = events.Snapshot(seq=7, seq_in_band=3)
    assert warm.discontinuity(kept, snapshot, [_received(6), _received(7)]) is None
    assert warm.discontinuity(kept, events.Snapshot(seq=5, seq_in_band=3), []) is None
    kept.close()


@pytest.mark.parametrize(
    ("snapshot", "tail", "reason"),
    [
        ((4, 3), [], "log_behind"),  # the log is shorter than what the session holds
        ((6, 4), [6], "in_band_since"),  # another orchestrator wrote in-band
        ((7, 3), [7], "gap"),
        ((6, 3), [(6, "in_band")], "in_band_event"),  # landed after the snapshot
        ((6, 3), [(6, "cancel")], "event:run_cancelled"),
        ((8, 3), [6, 7], "short_read"),  # the read stopped below the snapshot's seq
    ],
)
def test_anything_else_goes_cold(snapshot: tuple[int, int], tail: list[Any], reason: str) -> None:
    kept = _kept("one", 5)
    new = []
    for item in tail:
        if isinstance(item, int):
            new.append(_received(item))
        elif item[1] == "in_band":
            new.append(_received(item[0], in_band=True))
        else:
            new.append(_logged(item[0], events.RunCancelled(reason="x")))
    seen = warm.discontinuity(kept, events.Snapshot(seq=snapshot[0], seq_in_band=snapshot[1]), new)
    assert seen == reason
    kept.close()


def test_the_least_recently_kept_is_evicted_past_the_count() -> None:
    cache = warm.WarmRuns(runs=2, max_events=1000)
    a, b, c = _kept("a", 3), _kept("b", 4), _kept("c", 5)
    cache.put(a)
    cache.put(b)
    assert cache.take(_id("a")) is a  # taken: out of the cache, the delivery owns it
    assert _id("a") not in cache and cache.events == 4
    cache.put(a)  # kept again: now the most recent
    cache.put(c)
    assert _id("b") not in cache and b.replay.closed  # evicted and closed
    assert {_id("a"), _id("c")} == {k.run_id for k in cache.sessions()} and cache.events == 8
    cache.clear()
    assert len(cache) == 0 and cache.events == 0 and a.replay.closed and c.replay.closed


def test_the_events_bound_evicts_and_refuses_a_run_larger_than_it() -> None:
    cache = warm.WarmRuns(runs=10, max_events=10)
    a, b, big = _kept("a", 6), _kept("b", 6), _kept("big", 11)
    cache.put(a)
    cache.put(b)  # 12 events: a goes
    assert _id("a") not in cache and a.replay.closed and cache.events == 6
    cache.put(big)  # alone past the bound: never kept, nothing evicted for it
    assert _id("big") not in cache and big.replay.closed and _id("b") in cache
    cache.clear()


def test_zero_turns_it_off() -> None:
    cache = warm.WarmRuns.from_settings(settings.load({}, TREADLE_WARM_RUNS=0))
    assert not cache.enabled
    kept = _kept("a", 2)
    cache.put(kept)
    assert len(cache) == 0 and kept.replay.closed
    defaults = warm.WarmRuns.from_settings(settings.load({}))
    assert defaults.enabled and defaults.max_runs == 1000
