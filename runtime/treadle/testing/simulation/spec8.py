"""Spec 8 runs in the simulation: which runs are spec 8, how they start, the owner faults.

- ``formats``: each run's format for a mode (``"9"``: every run spec 9, as the
  pinned seeds were found; ``"8"``: every run spec 8; ``"mixed"``: each run spec 8
  with probability ``MIXED_SHARE``, from the seed's own ``spec`` stream, so both
  formats run side by side on one World and the same workers);
- ``programs``: each run's program; a spec 9 run's is drawn as in every mode (the
  ``program`` stream is consumed for every run), a spec 8 run's from its own
  stream by ``workload8``;
- ``Starter``: starts a run in its format through a client whose settings say
  ``WORKFLOW_SPEC_VERSION=8`` (the way an app mints spec 8 runs); a build whose
  settings do not know 8 yet starts it with ``client.start_run(spec_version=8)``;
- ``strike_owners``: the ``kill_owner`` / ``lose_owner`` faults (``faults``), aimed
  at a delivery running an inline body of a spec 8 run;
- ``tally``: the seed-wide spec 8 counters (backstop wakes armed, single-flight
  absorptions) for the report.

Used by the runner.
"""

from __future__ import annotations

import asyncio
import collections
import random
from typing import Any

from treadle import clock, errors, settings
from treadle.client import Run, Workflows, start_run
from treadle.sdk import functions
from treadle.testing.simulation import workload, workload8
from treadle.world import constants, ids

MODES = ("8", "9", "mixed")
MIXED_SHARE = 0.5
# How often an owner fault looks for a victim (virtual seconds, on average).
_TICK_SECONDS = 2.0
# A lost owner message must leave a message of the run due within this long.
_DRIVER_WITHIN_SECONDS = 900.0


def supported() -> bool:
    """Can this build drive spec 8 runs?"""
    return constants.SPEC_VERSION_LEGACY in constants.SUPPORTED_SPEC_VERSIONS


def default_mode() -> str:
    """The CLI's default: both formats side by side once the build drives spec 8."""
    return "mixed" if supported() else "9"


def formats(seed: int, mode: str, runs: int) -> list[int]:
    if mode not in MODES:
        raise ValueError(f"spec mode {mode!r}: expected one of {', '.join(MODES)}")
    if mode == "9":
        return [constants.SPEC_VERSION_SINGLE_ORCHESTRATOR] * runs
    if mode == "8":
        return [constants.SPEC_VERSION_LEGACY] * runs
    rng = random.Random(f"{seed}/spec")
    return [
        constants.SPEC_VERSION_LEGACY
        if rng.random() < MIXED_SHARE
        else constants.SPEC_VERSION_SINGLE_ORCHESTRATOR
        for _ in range(runs)
    ]


def programs(seed: int, shape: workload.Shape, specs: list[int]) -> list[workload.Program]:
    base_rng = random.Random(f"{seed}/program")
    spec8_rng = random.Random(f"{seed}/program8")
    out = []
    for i, spec in enumerate(specs):
        base = workload.generate(base_rng, shape, prefix=f"r{i}.")
        if spec == constants.SPEC_VERSION_LEGACY:
            out.append(workload8.generate(spec8_rng, shape, prefix=f"r{i}."))
        else:
            out.append(base)
    return out


class Starter:
    """Starts runs in either format on the simulation's client World."""

    def __init__(self, app: Workflows, world: Any, overrides: dict[str, Any]) -> None:
        self.app = app
        self.app8: Workflows | None = None
        try:
            minting = settings.load({}, **overrides, WORKFLOW_SPEC_VERSION=8)
        except errors.SettingsError:
            return  # this build's settings do not know 8 yet: start_run below
        self.app8 = Workflows(world=world, worker=False, settings_=minting)

    def register(self, build: Any) -> None:
        """Register the simulated workflow on the spec 8 client too (``workload.build``)."""
        if self.app8 is not None:
            build(self.app8)

    async def start(self, spec: int, ops: list[workload.Op], timeout: float | None = None) -> Run:
        if spec != constants.SPEC_VERSION_LEGACY:
            return await self.app.start("sim_program", ops, timeout=timeout)
        if self.app8 is not None:
            return await self.app8.start("sim_program", ops)
        world = await self.app.world()
        run_id = ids.new_run_id()
        await start_run(
            world,
            name="sim_program",
            data=functions.encode_arguments((ops,), {}, "workflow sim_program"),
            deployment_id=self.app.settings.TREADLE_DEPLOYMENT_ID,
            spec_version=constants.SPEC_VERSION_LEGACY,
            run_id=run_id,
        )
        return Run(self.app, run_id)


def _other_driver(sim: Any, run_id: str, lost: str) -> bool:
    """Is a message of ``run_id`` other than ``lost`` queued, in flight or due soon
    enough to drive the run (a wake, a backstop, a step's message)?"""
    queue = sim.backend.queue
    now = clock.monotonic()
    for message_id in sim.backend.messages_of(run_id):
        if message_id == lost:
            continue
        if message_id in queue.leased:
            return True
        entry = queue.ready.get(message_id)
        if entry is not None and entry.due - now <= _DRIVER_WITHIN_SECONDS:
            return True
    return False


async def strike_owners(sim: Any, kind: str) -> None:
    """``kill_owner`` / ``lose_owner``: now and then (``rate`` per virtual second of an
    inline body running) the process of a delivery running an inline body of a spec 8
    run dies mid-body; ``lose_owner`` loses that delivery's message first."""
    plan = sim.injector.plan
    rate = plan.rates.get(kind, 0.0)
    if not rate:
        return
    rng = random.Random(f"{sim.seed}/{kind}")
    while True:
        await asyncio.sleep(rng.expovariate(1 / _TICK_SECONDS))
        now = sim.now()
        if now >= plan.quiet_after or sim.injector.left <= 0:
            return
        held = {i.message_id for i in sim.backend.in_flight() if i.kind == "orchestrator"}
        owners = [
            b
            for b in sim.ledger.bodies
            if b.ended is None
            and b.kind == "orchestrator"
            and b.message_id in held
            and b.run_id in sim.spec8_runs
            and not sim.processes[b.process].dead
        ]
        if not owners or rng.random() >= rate * _TICK_SECONDS:
            continue
        body = rng.choice(owners)
        if kind == "lose_owner" and not _other_driver(sim, body.run_id, body.message_id):
            continue
        if not sim.injector.take(kind, "owner", body.run_id, body.process, now):
            continue
        if kind == "lose_owner":
            sim.backend.lose_message(body.message_id)
        sim.on_kill(sim.processes[body.process])


def tally(sim: Any) -> collections.Counter[str]:
    """Seed-wide spec 8 counters: backstop wakes armed, single-flight absorptions."""
    found: collections.Counter[str] = collections.Counter()
    found["backstops armed"] = sum(":backstop:" in key for key in sim.backend.queue.keys)
    for proc in sim.processes.values():
        worker = proc.worker
        flight = getattr(getattr(worker, "rt", None), "single_flight", None)
        found["single-flight absorbed"] += int(getattr(flight, "absorbed", 0))
    return +found
