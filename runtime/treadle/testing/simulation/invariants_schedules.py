"""The invariants of generated schedules (``gen_schedules``), checked on what the memory
World ends with once it is quiet: every schedule write in order
(``MemoryBackend.schedule_writes``), and every run a schedule started.

- ``schedule_run_twice``: one run per firing time (the runs carrying one schedule's
  ``treadle.schedule`` and one ``treadle.scheduled_at``), and it is the run whose id
  that time derives (``firing.run_id_for``).
- ``schedule_claim_unstarted``: every claimed firing (a write naming a new
  ``last_run_id``) has its run once the World is quiet, however its scheduler died.
- ``schedule_run_unclaimed``: no run of a schedule but a claimed one.
- ``schedule_accounting``: every write that moves ``next_fire_at`` on handles exactly
  the cron times it passes, each once: a claim (a run), a skip (``skipped`` + 1), a held
  firing (``buffered_at``), or, all of them older than the catch-up window at that
  write, ``missed`` + their count; a write that does not move it (a trigger, a backfill,
  a held firing's start) handles one firing; a put (create, pause, resume) keeps the
  counters. So ``skipped`` and ``missed`` agree with the runs.
- ``schedule_policy``: a skip or a held firing only where the overlap policy allows it
  (never under ``allow`` or ``cancel_other``; a hold only under ``buffer_one``, a skip
  there only while a firing is held), each with a last run to wait on; a held firing's
  start starts the held time.
- ``schedule_overlap``: under ``skip`` or ``buffer_one`` no cron firing (nor a held
  one's start) started while the last run had not ended; under ``cancel_other`` the
  run such a firing found running ended cancelled (unless it ended before the new run
  was created: the cancel comes first).
- ``schedule_not_quiet``: the World was not quiet by the bound (a run of a schedule
  never ended, or a firing is still held after its blocking run ended).
"""

from __future__ import annotations

import collections
from datetime import UTC, datetime, timedelta
from typing import Any

from treadle.schedules import cron as cron_
from treadle.schedules import firing
from treadle.schedules import spec as spec_
from treadle.testing.simulation.gen_schedules import SchedulePlan, quiet
from treadle.testing.simulation.invariants import Violation
from treadle.testing.simulation.loop import EPOCH
from treadle.world import records


def runs_of(backend: Any) -> dict[str, tuple[str, str]]:
    """Run id -> (schedule name, scheduled_at) of every run a schedule started."""
    found: dict[str, tuple[str, str]] = {}
    for run_id in backend.run_ids():
        attrs = backend.run_record(run_id).attributes
        if "treadle.schedule" in attrs:
            found[run_id] = (str(attrs["treadle.schedule"]), str(attrs.get("treadle.scheduled_at")))
    return found


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat(timespec="milliseconds")


def check(backend: Any, plan: SchedulePlan | None) -> list[Violation]:
    if plan is None:
        return []
    out: list[Violation] = []
    if not quiet(backend, plan):
        out.append(Violation("schedule_not_quiet", None, _not_quiet(backend, plan)))
    runs = runs_of(backend)
    by_time: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for run_id, key in runs.items():
        by_time[key].append(run_id)
    for (name, at), ids in sorted(by_time.items()):
        if len(ids) > 1:
            out.append(Violation("schedule_run_twice", None, f"{name} at {at}: runs {ids}"))
        for run_id in ids:
            if run_id != firing.run_id_for(name, datetime.fromisoformat(at)):
                out.append(
                    Violation("schedule_run_twice", run_id, f"{name} at {at}: not its time's id")
                )
    claimed: set[str] = set()
    for kind, before, after in backend.schedule_writes:
        if after.state.last_run_id is not None and (
            before is None or before.state.last_run_id != after.state.last_run_id
        ):
            claimed.add(after.state.last_run_id)
        out += _judge_write(kind, before, after)
        if kind == "update" and before is not None:
            out += _judge_overlap(backend, before, after)
    for run_id in sorted(claimed - set(runs)):
        out.append(Violation("schedule_claim_unstarted", run_id, "claimed, never started"))
    for run_id in sorted(set(runs) - claimed):
        out.append(Violation("schedule_run_unclaimed", run_id, f"{runs[run_id]} never claimed"))
    return out


def tally(backend: Any, plan: SchedulePlan | None, injector: Any) -> dict[str, int]:
    """What the seed's schedules did (the soak line): schedules and their policies, runs
    fired, skipped and missed firings, held firings, claims the process died after."""
    if plan is None:
        return {}
    found: collections.Counter[str] = collections.Counter(
        {"seeds": 1, "schedules": len(plan.schedules), "runs": len(runs_of(backend))}
    )
    found.update(f"policy:{s.overlap}" for s in plan.schedules)
    for s in plan.schedules:
        record = backend.schedules.get(s.name)
        if record is not None:
            found["skipped"] += record.state.skipped
            found["missed"] += record.state.missed
    found["held"] = sum(
        1 for _, b, a in backend.schedule_writes
        if b is not None and b.state.buffered_at is None and a.state.buffered_at is not None
    )  # fmt: skip
    found["killed_after_claim"] = sum(1 for f in injector.log if f.point == "schedules.claimed")
    found["action_errors"] = len(plan.errors)
    return {k: v for k, v in found.items() if v}


def _not_quiet(backend: Any, plan: SchedulePlan) -> str:
    open_runs = [r for r in runs_of(backend) if not backend.run_record(r).is_terminal]
    held = [
        s.name
        for s in plan.schedules
        if (rec := backend.schedules.get(s.name)) is not None and rec.state.buffered_at
    ]
    return f"runs not ended {open_runs[:5]}; firings held by {held}"


def _judge_write(
    kind: str, before: records.ScheduleRecord | None, after: records.ScheduleRecord
) -> list[Violation]:
    if before is None:
        return []
    b, a = before.state, after.state
    d_skipped, d_missed = a.skipped - b.skipped, a.missed - b.missed
    where = f"{after.name} v{after.version} at {after.updated_at.timestamp() - EPOCH:.3f}"
    if kind == "put" or a.paused != b.paused:
        # A put (create or update by name), a pause, a resume: the firing state stays.
        kept = (d_skipped, d_missed, a.last_run_id) == (0, 0, b.last_run_id)
        if not kept:
            return [Violation("schedule_accounting", None, f"{where}: a {kind} moved the state")]
        return []
    held = b.buffered_at is None and a.buffered_at is not None
    unheld = b.buffered_at is not None and a.buffered_at is None
    # A start names its time's run as the last; a time already started (a trigger at the
    # very instant of a cron time, then that cron time) names the same run again: the
    # previous run is then the last one itself, and nothing else moved.
    again = (
        a.last_run_id == b.last_run_id == a.previous_run_id
        and (d_skipped, d_missed) == (0, 0)
        and not held
    )
    started = a.last_run_id != b.last_run_id or again
    handled = int(started) + int(held) + d_skipped
    found: list[str] = []
    if a.next_fire_at != b.next_fire_at and b.next_fire_at is not None:
        c = spec_.parsed(after.spec)
        passed = _times(c, b.next_fire_at, a.next_fire_at)
        if d_missed:
            window = timedelta(seconds=after.spec.catchup_window_seconds)
            if handled or len(passed) != d_missed:
                found.append(f"missed +{d_missed} over {len(passed)} cron time(s), {handled} more")
            if passed and passed[-1] >= after.updated_at - window:
                found.append(f"missed {_iso(passed[-1])}, within the window at the write")
        elif len(passed) != 1 or handled != 1:
            found.append(f"{len(passed)} cron time(s) passed, {handled} handled")
        elif started and a.last_fired_at != b.next_fire_at:
            found.append(f"started {a.last_fired_at}, the cron time was {_iso(b.next_fire_at)}")
        elif held and a.buffered_at != b.next_fire_at:
            found.append(f"held {a.buffered_at}, the cron time was {_iso(b.next_fire_at)}")
    elif d_missed or handled != 1:
        found.append(f"a firing outside the cron handled {handled}, missed +{d_missed}")
    if unheld and (not started or a.last_fired_at != b.buffered_at):
        found.append(f"the held {b.buffered_at} released without its start")
    out = [Violation("schedule_accounting", None, f"{where}: {f}") for f in found]
    policy = after.spec.overlap
    wrong = (
        (d_skipped and policy in ("allow", "cancel_other"))
        or (held and policy != "buffer_one")
        or (d_skipped and policy == "buffer_one" and b.buffered_at is None)
        or ((d_skipped or held) and b.last_run_id is None)
    )
    if wrong and not d_missed:
        # Backfills fire under "allow" (gen_schedules); triggers under the schedule's own.
        what = "skip" if d_skipped else "hold"
        out.append(Violation("schedule_policy", None, f"{where}: a {what} under {policy}"))
    return out


def _ended_at(backend: Any, run_id: str) -> tuple[datetime | None, str]:
    """When the run's log ended it, and its status (None: it has not ended)."""
    try:
        record = backend.run_record(run_id)
    except Exception:
        return None, "missing"
    for logged in backend.events_of(run_id):
        if logged.type in ("run_completed", "run_failed", "run_cancelled"):
            return logged.created_at, record.status
    return None, record.status


def _judge_overlap(
    backend: Any, before: records.ScheduleRecord, after: records.ScheduleRecord
) -> list[Violation]:
    b, a = before.state, after.state
    cron_start = a.next_fire_at != b.next_fire_at and a.last_run_id != b.last_run_id
    held_start = b.buffered_at is not None and a.buffered_at is None
    if not (cron_start or held_start) or b.last_run_id in (None, a.last_run_id):
        return []  # no start, or the same run named again (the time was started before)
    if a.paused != b.paused:
        return []
    ended, status = _ended_at(backend, b.last_run_id)
    at = after.updated_at
    where = f"{after.name} v{after.version} at {at.timestamp() - EPOCH:.3f}"
    policy = after.spec.overlap
    if policy in ("skip", "buffer_one") and (ended is None or ended > at):
        when = "never" if ended is None else f"at {ended.timestamp() - EPOCH:.3f}"
        return [
            Violation(
                "schedule_overlap",
                a.last_run_id,
                f"{where}: started under {policy} while {b.last_run_id} ran (it ended {when})",
            )
        ]
    log = backend.events_of(a.last_run_id) if a.last_run_id in backend.run_ids() else []
    created = log[0].created_at if log else None
    # Its cancel is written before the new run is created (``firing.act``): a run still
    # running then ends cancelled (a completion between the claim and the cancel is fine).
    late = ended is None or (created is not None and ended > created)
    if policy == "cancel_other" and late and status != "cancelled":
        return [
            Violation(
                "schedule_overlap",
                b.last_run_id,
                f"{where}: found running under cancel_other, ended {status}, not cancelled",
            )
        ]
    return []


def _times(c: cron_.Cron, start: datetime, end: datetime | None) -> list[datetime]:
    """The cron times in [start, end) (``end`` None: just ``start``)."""
    found: list[datetime] = []
    t: datetime | None = start
    while t is not None and (end is None or t < end) and len(found) < 100_000:
        found.append(t)
        if end is None:
            break
        t = c.next_after(t)
    return found
