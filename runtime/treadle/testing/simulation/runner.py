"""One simulated seed: processes, runs, outside actors, faults, then the invariants.

``simulate(seed, config)`` builds everything from the seed (programs, fault
plan, schedule, ids, queue choices: each from its own PRNG stream derived from
the seed, so shrinking the program does not reshuffle the schedule's draws),
runs it on a fresh ``SimLoop`` under ``treadle.clock.use(SimClock)``, and returns
a ``Report``: runs, simulated seconds, faults by kind, deliveries and handoffs
per run, violations, and a trace whose equality across two runs of one seed is
the determinism check. Used by ``__main__``, ``shrink`` and the tests.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any

from treadle import clock, errors, settings
from treadle.client import Workflows
from treadle.orchestrator import runahead, warm
from treadle.testing.memory.consumer import current_delivery
from treadle.testing.simulation import (
    collect,
    faults,
    gen_attributes,
    gen_children,
    gen_hookclaims,
    gen_limits,
    gen_schedules,
    gen_streams,
    gen_timeouts,
    invariants,
    invariants8,
    invariants_children,
    invariants_limits,
    invariants_schedules,
    invariants_timeouts,
    loop,
    spec8,
    warmsessions,
    workload,
    workload8,
)
from treadle.testing.simulation.faults import FaultPlan, Injector
from treadle.testing.simulation.processes import IgnoredLease, Process, task_recorder
from treadle.world import contract, events

log = logging.getLogger("treadle.testing.simulation")

SETTINGS: dict[str, Any] = {
    "WORKFLOW_ORCHESTRATOR_LINGER_MS": 3000,
    "WORKFLOW_ORCHESTRATOR_POLL_INTERVAL_MS": 500,
    "WORKFLOW_ORCHESTRATOR_FEED_POLL_INTERVAL_MS": 2000,
    "WORKFLOW_V2_TIMEOUT_MS": 12000,
    "WORKFLOW_INLINE_STEP_DEADLINE_MARGIN_MS": 2000,
    "WORKFLOW_STEP_RETRY_DELAY_SECONDS": 0.5,
    "WORKFLOW_WAIT_CONTINUATION_MAX_DELAY_SECONDS": 120,
    "TREADLE_DEPLOYMENT_ID": "sim",
    # No lint on a worker's start: it reads files in a real thread, whose completion
    # would land at a wall-clock moment in virtual time (a seed must replay).
    "TREADLE_LINT_ON_LOAD": False,
    # No firing loop but on the seeds gen_schedules draws schedules for (``_main``): no
    # extra World calls or timers change what the pinned seeds replay.
    "TREADLE_SCHEDULES_ENABLED": False,
}
# The share of seeds drawn with run-ahead off (``Config.run_ahead`` None).
RUN_AHEAD_OFF_SHARE = 0.25
TUNING = contract.QueueTuning(lease_seconds=10.0, backoff_base_seconds=0.5, backoff_max_seconds=8.0)


GENERATORS = (
    "attributes", "children", "timeouts", "streams", "hook_claims", "limits", "schedules",
    "stream_fences",
)  # fmt: skip


@dataclass
class Config:
    runs: int = 3
    processes: int = 2
    shape: workload.Shape = field(default_factory=workload.Shape)
    plan: FaultPlan | None = None  # None: drawn from the seed
    interleave: bool = True
    horizon: float = 6000.0  # virtual seconds every run must end within
    watchdog_seconds: float = 3.0
    # Run formats (``spec8.MODES``): "9" as the pinned seeds were found, "8", "mixed".
    spec: str = "9"
    # Optimistic starts (issue 15 item 2), ``OPTIMISTIC``: "seed" draws the opt-in
    # WORKFLOW_OPTIMISTIC_BACKGROUND_START per seed (``optimistic_mode``), turbo's early
    # inline bodies at their default (on); "default" as shipped; "on" both on; "off" both
    # off. ``simulate`` resolves "seed", so a report's replay names what the seed ran.
    optimistic: str = "seed"
    # WORKFLOW_INLINE_OWNERSHIP (False: seed 000's kill switch) and its lease (virtual s).
    ownership: bool = True
    ownership_lease: float = workload8.LEASE_SECONDS
    # WORKFLOW_RUN_AHEAD_DEPTH (issue 15 item 1); None: drawn from the seed (off for about
    # a quarter of the seeds, else the default), from its own stream.
    run_ahead: int | None = None
    # TREADLE_WARM_RUNS (issue 15 item 5, ``warmsessions.draw``); None: drawn per seed.
    warm: int | None = None
    # The generators issue 17 added (``GENERATORS``: attributes, child workflows, timeouts,
    # streams, hook force-claims, limits); None: all of them. () draws programs as seeds did
    # before these existed, for a scenario pinned then (``--no-features``); a scenario
    # pinned with one of them names just that one (``--generators children``).
    generators: tuple[str, ...] | None = None

    def generates(self, name: str) -> bool:
        """Whether issue 17's generator ``name`` draws into this simulation's programs."""
        assert name in GENERATORS, name
        return self.generators is None or name in self.generators

    # Child workflows drawn into spec 9 programs (``gen_children``, a stream of its own).
    children: bool = True
    # Generated hook force-claims (gen_hookclaims); off for a scenario pinned before them.
    hook_claims: bool = True

    def run_ahead_depth(self, seed: int) -> int:
        if self.run_ahead is not None:
            return self.run_ahead
        off = random.Random(f"{seed}/run-ahead").random() < RUN_AHEAD_OFF_SHARE
        return 0 if off else int(settings.Settings.model_fields["WORKFLOW_RUN_AHEAD_DEPTH"].default)

    def settings(self) -> dict[str, Any]:
        return {
            **SETTINGS,
            "WORKFLOW_INLINE_OWNERSHIP": self.ownership,
            "WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS": self.ownership_lease,
            **optimistic_settings(self.optimistic),
        }


OPTIMISTIC = ("seed", "default", "on", "off")


def optimistic_mode(mode: str, seed: int) -> str:
    """``Config.optimistic`` for one seed: "seed" is drawn from its own stream, the opt-in
    background start on for half the seeds ("on"), else "default"."""
    if mode != "seed":
        return mode
    return "on" if random.Random(f"{seed}/optimistic").random() < 0.5 else "default"


def optimistic_settings(mode: str) -> dict[str, Any]:
    """The optimistic-start settings of ``mode`` ("seed" as "default" until drawn)."""
    if mode == "off":
        return {"WORKFLOW_OPTIMISTIC_INLINE_START": False}  # also wins over the background one
    return {"WORKFLOW_OPTIMISTIC_BACKGROUND_START": mode == "on"}


@dataclass
class Report:
    seed: int
    plan: FaultPlan
    config: Config
    runs: int = 0
    sim_seconds: float = 0.0
    real_seconds: float = 0.0
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    deliveries: dict[str, int] = field(default_factory=dict)
    handoffs: int = 0
    violations: list[invariants.Violation] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    programs: list[workload.Program] = field(default_factory=list)
    # Each run's format, and for the spec 8 runs: seed 000's residual risks met (counted,
    # not failed) and what else happened (owned recoveries, backstops, absorptions).
    specs: list[int] = field(default_factory=list)
    residuals: collections.Counter[str] = field(default_factory=collections.Counter)
    spec8_notes: collections.Counter[str] = field(default_factory=collections.Counter)

    spec8_run_ids: set[str] = field(default_factory=set)
    # Run-ahead (orchestrator.runahead.STATS, this seed's share): its depth, groups
    # written, repairs, stops, restarts, and the residual risk of seed 003 "Step bodies a
    # run-ahead stop can run twice" (bodies_at_risk; counted and reported, never failed).
    run_ahead_depth: int = 0
    run_ahead: collections.Counter[str] = field(default_factory=collections.Counter)
    # Warm sessions (``warmsessions``): the seed's settings and what its deliveries did.
    warm_settings: dict[str, int] = field(default_factory=dict)
    warm: collections.Counter[str] = field(default_factory=collections.Counter)
    # Schedules (``gen_schedules``): runs fired, skipped, missed, claims killed...
    schedules: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def spec8_runs(self) -> int:
        return sum(s < 9 for s in self.specs)

    @property
    def ok(self) -> bool:
        return not self.violations

    def replay_command(self) -> str:
        c = self.config
        parts = [
            f"python -m treadle.testing.simulation --seed {self.seed}",
            f"--plan '{self.plan}'",
        ]
        if c.runs != Config.runs:
            parts.append(f"--runs {c.runs}")
        if c.shape.max_ops != workload.Shape.max_ops:
            parts.append(f"--ops {c.shape.max_ops}")
        if c.processes != Config.processes:
            parts.append(f"--processes {c.processes}")
        parts.append(f"--spec {c.spec}")
        if c.optimistic != Config.optimistic:
            parts.append(f"--optimistic {c.optimistic}")
        if not c.ownership:
            parts.append("--no-ownership")
        if c.ownership_lease != Config.ownership_lease:
            parts.append(f"--lease {c.ownership_lease:g}")
        if c.run_ahead is not None:
            parts.append(f"--run-ahead {c.run_ahead}")
        if c.warm is not None:
            parts.append(f"--warm {c.warm}")
        if c.generators is not None:
            parts.append(f"--generators '{','.join(c.generators)}'")
        if not c.children:
            parts.append("--no-children")
        if not c.hook_claims:
            parts.append("--no-hook-claims")
        return " ".join(parts)


class Simulation:
    """The state of one seed's simulation while it runs."""

    def __init__(self, seed: int, config: Config, plan: FaultPlan) -> None:
        self.seed = seed
        self.config = config
        self.rng = random.Random(f"{seed}/actors")
        self.injector = Injector(
            plan, random.Random(f"{seed}/faults"), random.Random(f"{seed}/faults/later")
        )
        self.processes: dict[str, Process] = {}
        self.ledger = workload.Ledger()
        self.concurrency = 8
        self.backend: Any = None
        self.app: Workflows | None = None
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.cancelled: set[str] = set()
        self.ownership_lost: list[tuple[float, str | None]] = []  # (time, run or None = all)
        self._spawned = 0
        self.resumed: dict[tuple[str, str | None, int], asyncio.Event] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self.ignored_leases: list[IgnoredLease] = []
        self.spec8_runs: set[str] = set()
        self.schedule_plan: gen_schedules.SchedulePlan | None = None
        # Kills right after a schedule claim (``schedules.claimed``), a stream of its own.
        self.claim_kills = random.Random(f"{seed}/schedules/kills")
        # Runs whose first write may draw a fence (``gen_streams.FENCE_SHARE``).
        self.stream_first: set[str] = set()
        self.stream_fences = random.Random(f"{seed}/streams/fences")
        self.identity_rng = random.Random(f"{seed}/identity")
        self.restarts_in_place = 0

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def stall_seconds(self) -> float:
        return TUNING.lease_seconds * self.rng.choice([1.5, 2.0, 3.0])

    def on_kill(self, proc: Process) -> None:
        proc.kill(self.now())
        self.ownership_lost.append((self.now(), None))
        if sum(not p.dead for p in self.processes.values()) == 0 or self.rng.random() < 0.7:
            # Half the time the next process restarts in place, under the dead one's
            # identity (drawn from a stream of its own: the actors' draws stay as pinned).
            in_place = self.identity_rng.random() < 0.5
            identity = proc.worker_id if in_place else None
            self._spawn_later(self.rng.choice([0.5, 5.0, 20.0]), identity)

    def force_lapse(self, run_id: str | None, proc: Process) -> bool:
        """The lease of the calling delivery (else the first in flight for ``run_id``)
        lapses now; True when one did."""
        leased = current_delivery.get()
        mine = [leased.message_id] if leased is not None and leased.run_id == run_id else []
        held = [i.message_id for i in self.backend.in_flight() if i.run_id == run_id]
        for message_id in [m for m in mine if m in held] or held[:1]:
            if self.backend.force_lease_lapse(message_id):
                self.ownership_lost.append((self.now(), run_id))
                return True
        return False

    async def until_written(self, run_id: str | None, bound: float = 20.0) -> None:
        """Wait until another in-band event of ``run_id`` is logged (or ``bound`` s)."""
        if run_id is None:
            return
        seen = len(self.backend.events_of(run_id))
        waited = 0.0
        while waited < bound and len(self.backend.events_of(run_id)) == seen:
            await asyncio.sleep(0.25)
            waited += 0.25

    async def at_any_instant(self, kind: str) -> None:
        """Faults not tied to a World call, now and then (``rate`` per virtual second),
        to a live process (one holding a run's delivery if any), whatever it is doing:

        - ``pause``: every World call it makes blocks past its leases, so a delivery
          lingering on a hook, a sleep or an inline body is redelivered elsewhere, then
          resumes stale;
        - ``crash``: it dies at once, at whatever await point its tasks are (a body's
          sleep, a linger, a read): its state is gone, its leases lapse.
        """
        rate = self.injector.plan.rates.get(kind, 0.0)
        if not rate:
            return
        rng = random.Random(f"{self.seed}/{kind}")
        while True:
            await asyncio.sleep(rng.expovariate(rate))
            now = self.now()
            alive = [p for name, p in sorted(self.processes.items()) if not p.dead]
            busy = {i.world for i in self.backend.in_flight() if i.kind == "orchestrator"}
            chosen = [p for p in alive if p.name in busy] or alive
            if now >= self.injector.plan.quiet_after or self.injector.left <= 0:
                return
            if chosen:
                proc = rng.choice(chosen)
                if not self.injector.take(kind, "process", None, proc.name, now):
                    continue
                if kind == "pause":
                    proc.stall(now, self.stall_seconds())
                else:
                    self.on_kill(proc)

    def _spawn_later(self, delay: float, worker_id: str | None = None) -> None:
        async def spawn() -> None:
            await asyncio.sleep(delay)
            await self.spawn(worker_id)

        self._keep(spawn())

    def _keep(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def spawn(self, worker_id: str | None = None) -> Process:
        self._spawned += 1
        proc = Process(f"p{self._spawned}", self, worker_id)
        if worker_id is not None:
            self.restarts_in_place += 1
        self.processes[proc.name] = proc
        assert self.app is not None
        await proc.start(self.app)
        return proc

    # -- outside actors -------------------------------------------------------------------

    def _resumed(self, run_id: str, token: str | None, n: int) -> asyncio.Event:
        return self.resumed.setdefault((run_id, token, n), asyncio.Event())

    async def act(self, run: Any, actor: workload.Actor) -> None:
        await asyncio.sleep(actor.at)
        assert self.app is not None
        if actor.kind == "resume" and actor.n > 0:
            # The payload for a token's next hook goes out after the previous one landed.
            await self._resumed(run.run_id, actor.token, actor.n - 1).wait()
        # Until it lands or the run ends: a hook may appear late (seed 2637: a resume sent
        # at 0 s for a hook created at 870 s; a fixed retry budget gave up before it).
        while True:
            if run.run_id in self.ended:
                return
            try:
                if actor.kind == "resume":
                    assert actor.token is not None
                    await self.app.resume_hook(actor.token, workload.payload_of(actor))
                    self._resumed(run.run_id, actor.token, actor.n).set()
                elif actor.kind == "cancel":
                    self.cancelled.add(run.run_id)
                    await run.cancel("simulated cancel")
                elif actor.kind == "wake_up":
                    await run.wake_up()
                return
            except (errors.HookNotFound, errors.RunExpired):
                await asyncio.sleep(self.rng.choice([0.5, 2.0, 10.0]))

    async def watch(self, run_id: str, world: contract.World) -> None:
        while True:
            rec = await world.runs.get(run_id)
            if rec.is_terminal:
                self.ended[run_id] = self.now()
                return
            await asyncio.sleep(1.0)


def simulate(seed: int, config: Config | None = None) -> Report:
    """Run one seed and check every invariant; never raises for a violation."""
    config = config or Config()
    config = replace(config, optimistic=optimistic_mode(config.optimistic, seed))
    specs = spec8.formats(seed, config.spec, config.runs)
    plan = config.plan
    if plan is None:
        plan = FaultPlan.draw(
            random.Random(f"{seed}/plan"),
            random.Random(f"{seed}/plan/later"),
            random.Random(f"{seed}/plan/spec8") if min(specs, default=9) < 9 else None,
        )
    report = Report(seed, plan, config, specs=specs)
    report.programs = spec8.programs(seed, config.shape, specs)
    # Sequential inline chains for run-ahead to run through, from their own stream.
    workload.add_chains(report.programs, random.Random(f"{seed}/chains"), specs)
    if config.generates("attributes"):
        gen_attributes.add_attributes(report.programs, random.Random(f"{seed}/attributes"), specs)
    if config.children and config.generates("children"):
        gen_children.add_children(report.programs, random.Random(f"{seed}/children"), specs)
    if config.generates("timeouts"):  # step and run timeouts (issue 17 item 5)
        gen_timeouts.add_timeouts(report.programs, random.Random(f"{seed}/timeouts"), specs)
    if config.generates("streams"):
        gen_streams.add_streams(report.programs, random.Random(f"{seed}/streams"))  # 17.6
    if config.hook_claims and config.generates("hook_claims"):
        gen_hookclaims.add_claims(report.programs, random.Random(f"{seed}/claims"), specs)
    report.run_ahead_depth = config.run_ahead_depth(seed)
    report.warm_settings = warmsessions.draw(seed, config.warm)
    sim = Simulation(seed, config, plan)
    before = dataclasses.asdict(runahead.STATS)
    runahead.STATS.most_at_risk_in_a_stop = 0
    warm_before, verify_before = warmsessions.stats(), warm.VERIFY
    warm.VERIFY = warmsessions.verify
    warmsessions.take_mismatches()
    t0 = time.monotonic()
    try:
        # A held loop abandons ``_main`` inside its ``clock.use``: this block puts the
        # caller's clock back, or every later test in the process read a dead virtual one.
        with clock.use(clock.current()):
            outcomes = loop.run(
                lambda: _main(sim, report),
                rng=random.Random(f"{seed}/schedule"),
                interleave=config.interleave,
                on_task=task_recorder(sim.processes),
                watchdog_seconds=config.watchdog_seconds,
            )
    except loop.LoopHeld as held:
        report.violations.append(invariants.Violation("loop_held", None, str(held)))
        outcomes = []
    finally:
        warm.VERIFY = verify_before
    report.warm = warmsessions.delta(warm_before)
    for run_id, what in warmsessions.take_mismatches():
        report.violations.append(invariants.Violation("warm_mismatch", run_id, what))
    report.real_seconds = time.monotonic() - t0
    report.faults = sim.injector.counts
    _count_run_ahead(report, before)
    for o, spec in zip(outcomes, report.specs, strict=False):
        created = next((e.event for e in o.log if isinstance(e.event, events.RunCreated)), None)
        stamped = {o.spec_version, getattr(created, "spec_version", spec)}
        if stamped != {spec}:
            # A run keeps the format it was minted in (seed 003 "A run never changes format").
            report.violations.append(
                invariants.Violation("format", o.run_id, f"started as spec {spec}, now {stamped}")
            )
        if o.spec_version < 9:
            judged = invariants8.judge(o)
            report.violations += judged.violations
            report.residuals.update(judged.residuals)
            report.spec8_notes.update(judged.notes)
        else:
            report.violations += invariants.check(o)
            report.violations += invariants_timeouts.check(o)
            report.residuals.update(invariants.residuals(o))  # optimistic starts
        report.violations += gen_attributes.check(o)
        if sim.backend is not None:  # issue 17 item 6: what its streams stored
            report.violations += gen_streams.violations(o, sim.backend)
        report.deliveries[o.run_id] = o.deliveries
        report.handoffs += o.handoffs
        report.trace.append(f"log {o.run_id} " + " ".join(f"{e.slot}:{e.type}" for e in o.log))
    if sim.backend is not None:  # child workflows: the parents' children, as the World ends
        family = invariants_children.check(outcomes, sim.backend)
        report.violations += family.violations
        report.trace += family.trace
    report.violations += gen_hookclaims.check(outcomes)  # hook force-claims across runs
    report.trace += [
        f"fault {f.at:.6f} {f.kind} {f.point} {f.run_id} {f.process}" for f in sim.injector.log
    ]
    report.trace += [
        f"body {b.run_id} {b.op_id} {b.attempt} {b.process} {b.started:.6f} {b.ended} {b.how}"
        + (f" {b.kind} {b.message_id}" if b.run_id in sim.spec8_runs else "")
        for b in sim.ledger.bodies
    ]
    report.spec8_run_ids = set(sim.spec8_runs)
    if sim.spec8_runs and sim.backend is not None:
        report.spec8_notes.update(spec8.tally(sim))
    return report


def _count_run_ahead(report: Report, before: dict[str, int]) -> None:
    """This seed's run-ahead counts; a stop that put more bodies at risk of a second run
    than the depth allows is a violation (seed 003 bounds them by the depth)."""
    after = dataclasses.asdict(runahead.STATS)
    for name, value in after.items():
        if name != "most_at_risk_in_a_stop" and value - before[name]:
            report.run_ahead[name] = value - before[name]
    most = after["most_at_risk_in_a_stop"]
    if most > max(report.run_ahead_depth, 0):
        report.violations.append(
            invariants.Violation(
                "run_ahead_double_runs",
                None,
                f"one run-ahead stop left {most} bodies to run again, over the depth "
                f"{report.run_ahead_depth}",
            )
        )


async def _main(sim: Simulation, report: Report) -> list[invariants.RunOutcome]:
    from treadle.testing.memory import MemoryBackend, MemoryWorld

    ev_loop = asyncio.get_running_loop()
    assert isinstance(ev_loop, loop.SimLoop)
    with clock.use(loop.SimClock(ev_loop, random.Random(f"{sim.seed}/bytes"))):
        sim.backend = MemoryBackend(tuning=TUNING, rng=random.Random(f"{sim.seed}/queue"))
        client = MemoryWorld(sim.backend)
        # Schedules (session 9): None on most seeds; the firing loop runs only with them.
        plan = gen_schedules.draw(sim.seed) if sim.config.generates("schedules") else None
        sim.schedule_plan = plan
        overrides = {
            **sim.config.settings(),
            "WORKFLOW_RUN_AHEAD_DEPTH": report.run_ahead_depth,
            **report.warm_settings,
            "TREADLE_SCHEDULES_ENABLED": plan is not None,
        }
        app = Workflows(world=client, worker=False, settings_=settings.load({}, **overrides))
        workload.build(app, sim.ledger, ev_loop.time)
        # issue 17 item 4: None on most seeds, and with the issue 17 generators off
        limit_plan = gen_limits.draw(sim.seed) if sim.config.generates("limits") else None
        if limit_plan is not None:
            gen_limits.build(app, limit_plan)
        if plan is not None:
            gen_schedules.build(app)
        starter = spec8.Starter(app, client, overrides)
        starter.register(lambda other: workload.build(other, sim.ledger, ev_loop.time))
        sim.app = app
        for _ in range(sim.config.processes):
            await sim.spawn()
        sim._keep(sim.at_any_instant("pause"))
        sim._keep(sim.at_any_instant("crash"))
        for kind in faults.SPEC8_KINDS:
            if sim.injector.plan.rates.get(kind):  # no task otherwise: it would shift the draws
                sim._keep(spec8.strike_owners(sim, kind))
        runs = []
        for program, spec in zip(report.programs, report.specs, strict=True):
            run = await starter.start(spec, program.ops, program.run_timeout)
            if spec < 9:
                sim.spec8_runs.add(run.run_id)
            runs.append(run)
            if sim.config.generates("stream_fences") and gen_streams.writes_first(program):
                sim.stream_first.add(run.run_id)
            sim.started[run.run_id] = sim.now()
            sim._keep(sim.watch(run.run_id, client))
            for actor in program.actors:
                sim._keep(sim.act(run, actor))
            for token in gen_hookclaims.tokens_of(program):
                sim._keep(gen_hookclaims.act(sim, run, token))
        limited = None
        if limit_plan is not None:
            limited = await gen_limits.start(
                app, limit_plan, lambda: clock.now_ms() / 1000, sim._keep,
                lambda run_id: sim._keep(sim.watch(run_id, client)),
            )  # fmt: skip
        if plan is not None:
            await gen_schedules.start(app, plan, sim._keep)
        every = len(runs) + (len(limit_plan.runs) if limit_plan is not None else 0)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(sim.config.horizon):
                while len(sim.ended) < every:  # noqa: ASYNC110 - virtual time
                    await asyncio.sleep(5.0)
        await asyncio.sleep(30.0)  # late writes of the last deliveries land
        await asyncio.sleep(gen_children.settle_seconds(report.programs))  # children end
        if plan is not None:
            await gen_schedules.until_quiet(sim.backend, plan)
        report.runs = len(runs)
        report.sim_seconds = sim.now()
        out = [
            await collect.run_outcome(sim, client, run.run_id, program)
            for run, program in zip(runs, report.programs, strict=True)
        ]
        warmsessions.check_kept(sim.processes.values(), sim.backend)
        if limited is not None:
            recs = {h.run_id: await client.runs.get(h.run_id) for _, h in limited.started}
            report.violations += invariants_limits.check(sim.backend, limited, recs)
        report.violations += invariants_schedules.check(sim.backend, plan)
        report.schedules.update(invariants_schedules.tally(sim.backend, plan, sim.injector))
        for proc in sim.processes.values():
            proc.kill(sim.now())
        return out
