"""Generated schedules (docs/schedules.md; docs/plans/s8-sc.md "Simulation").

On a share of the seeds (drawn from a stream of its own, ``draw``) the simulation puts
one to three schedules in the World, each under one overlap policy (``skip``,
``buffer_one``, ``allow``, ``cancel_other``), firing every 10 to 30 virtual seconds a
run of ``sim_scheduled`` that sleeps a few seconds or longer than the period (so
firings overlap), some with a catch-up window of 2 s (a firing loop that stalls or
dies misses firings). Outside actors trigger them, backfill a past window (overlap
``allow``), and pause then resume them; at ``stop_at`` every schedule is paused, and the
World is quiet once every run of theirs ended and no firing is held (``quiet``).

The firing loop runs in every simulated process only on those seeds
(``TREADLE_SCHEDULES_ENABLED``), so the pinned seeds replay as before. The memory
World records every schedule write (``MemoryBackend.schedule_writes``) and has a fault
point right after a claim commits (``schedules.claimed``: a kill there is a scheduler
dead between its claim and its run's start). ``invariants_schedules`` judges them.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from treadle import Workflows, clock, sleep

log = logging.getLogger("treadle.testing.simulation")

SHARE = 0.5
POLICIES = ("skip", "buffer_one", "allow", "cancel_other")
WORKFLOW = "sim_scheduled"
# Virtual seconds after ``stop_at`` for every run of a schedule to end and no firing to be
# held (then ``schedule_not_quiet``).
QUIET_BOUND = 900.0


@dataclass(frozen=True)
class Action:
    at: float
    kind: str  # trigger | backfill | pause | resume
    seconds: float = 0.0  # backfill: how far back its window starts (it ends 5 s ago)


@dataclass(frozen=True)
class ScheduleDraw:
    name: str
    overlap: str
    every: int  # seconds between cron times
    run_seconds: float  # how long each run sleeps
    catchup: float  # the catch-up window, seconds
    actions: tuple[Action, ...] = ()


@dataclass
class SchedulePlan:
    schedules: tuple[ScheduleDraw, ...]
    stop_at: float
    # Filled in as the simulation runs: when each schedule was put, and its failures.
    put_at: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def draw(seed: int) -> SchedulePlan | None:
    rng = random.Random(f"{seed}/schedules")
    if rng.random() >= SHARE:
        return None
    drawn = []
    for n in range(rng.randint(1, 3)):
        every = rng.choice([10, 15, 20, 30])
        actions: list[Action] = []
        for _ in range(rng.randint(0, 3)):
            kind = rng.choice(["trigger", "trigger", "backfill", "pause"])
            at = round(rng.uniform(5.0, 150.0), 1)
            if kind == "pause":
                actions.append(Action(at, "pause"))
                actions.append(Action(at + rng.choice([5.0, 30.0, 70.0]), "resume"))
            else:
                actions.append(Action(at, kind, rng.choice([20.0, 45.0, 90.0])))
        drawn.append(
            ScheduleDraw(
                name=f"sch{n}",
                overlap=rng.choice(POLICIES),
                every=every,
                run_seconds=rng.choice([1.0, 5.0, every * 1.5, every * 3.0]),
                catchup=rng.choice([3600.0, 3600.0, 2.0]),
                actions=tuple(sorted(actions, key=lambda a: a.at)),
            )
        )
    return SchedulePlan(tuple(drawn), stop_at=rng.choice([120.0, 200.0]))


def build(app: Workflows) -> None:
    """Register the scheduled workflow on ``app`` (every simulated process's)."""

    @app.workflow(name=WORKFLOW)
    async def sim_scheduled(seconds: float) -> str:
        await sleep(seconds)
        return "ok"


def cron_of(every: int) -> str:
    """Six fields, seconds first: every ``every`` seconds (a divisor of 60)."""
    return f"*/{every} * * * * *"


async def start(app: Workflows, plan: SchedulePlan, keep: Any) -> None:
    """Put the plan's schedules now; their actors, and the final pause, in ``keep``."""
    for s in plan.schedules:
        await app.schedule(
            s.name, WORKFLOW, cron=cron_of(s.every), overlap=s.overlap,
            catchup_window=s.catchup, args=[s.run_seconds],
        )  # fmt: skip
        plan.put_at[s.name] = asyncio.get_running_loop().time()
        for action in s.actions:
            keep(_act(app, plan, s, action))
    keep(_stop(app, plan))


async def _act(app: Workflows, plan: SchedulePlan, s: ScheduleDraw, action: Action) -> None:
    await asyncio.sleep(action.at)
    if action.at >= plan.stop_at:
        return
    handle = app.get_schedule(s.name)
    try:
        if action.kind == "trigger":
            await handle.trigger()
        elif action.kind == "backfill":
            now = clock.utcnow()
            start = now - timedelta(seconds=action.seconds)
            await handle.backfill(start, now - timedelta(seconds=5), overlap="allow")
        elif action.kind == "pause":
            await handle.pause()
        elif action.kind == "resume":
            await handle.resume()
    except Exception as exc:  # the caller's World has no faults: worth a look
        plan.errors.append(f"{s.name} {action.kind} at {action.at}: {exc!r}")


async def _stop(app: Workflows, plan: SchedulePlan) -> None:
    await asyncio.sleep(plan.stop_at)
    for s in plan.schedules:
        try:
            await app.get_schedule(s.name).pause()
        except Exception as exc:
            plan.errors.append(f"{s.name} final pause: {exc!r}")


def quiet(backend: Any, plan: SchedulePlan) -> bool:
    """Every schedule paused, its last claimed firing's run created (a scheduler killed
    right after its claim leaves that to the next pass's ``settle``), every run of
    theirs ended, no firing held."""
    from treadle.testing.simulation import invariants_schedules

    for s in plan.schedules:
        record = backend.schedules.get(s.name)
        if record is None or not record.state.paused or record.state.buffered_at is not None:
            return False
        last = record.state.last_run_id
        if last is not None and last not in invariants_schedules.runs_of(backend):
            return False
    return all(backend.run_record(r).is_terminal for r in invariants_schedules.runs_of(backend))


async def until_quiet(backend: Any, plan: SchedulePlan) -> None:
    """Wait (virtual time) until ``quiet``, ``QUIET_BOUND`` seconds after ``stop_at`` at most."""
    loop = asyncio.get_running_loop()
    bound = plan.stop_at + QUIET_BOUND
    while loop.time() < bound and not quiet(backend, plan):  # noqa: ASYNC110 - virtual time
        await asyncio.sleep(5.0)
