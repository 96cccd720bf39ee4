"""Deterministic simulation of treadle's orchestrator: seeded schedules, faults, invariants.

The real orchestrator, step handler and queue rules (``treadle.orchestrator``
on a ``treadle.testing.memory`` World) run on one asyncio event loop with
virtual time; every choice (interleaving, queue order, ids, faults, when outside
actors act) comes from PRNG streams derived from one seed, so a seed replays
exactly. After each seed the invariants of DESIGN.md section 10 are checked.

Run it::

    python -m treadle.testing.simulation --seeds 200        # soak
    python -m treadle.testing.simulation --seed 17 --shrink # replay one, smaller

or from code (a test of your own)::

    from treadle.testing.simulation import Config, FaultPlan, simulate

    report = simulate(17, Config(runs=2, plan=FaultPlan.parse("kill=0.01,budget=4")))
    assert report.ok, [str(v) for v in report.violations] + [report.replay_command()]

Modules: ``loop`` (virtual time, interleavings, watchdog, ``SimClock``),
``workload`` (program grammar, generator, the real workflow and steps, the body
ledger), ``faults`` (plans and the injector), ``processes`` (worker processes
that die and stall), ``invariants``, ``runner`` (``simulate``), ``shrink``,
``__main__`` (the CLI). Spec 8 runs (``Config(spec="8" | "mixed")``, seed 000):
``spec8`` (formats, minting, owner faults), ``workload8`` (seed 000's shapes),
``invariants8`` (the spec 8 invariants; the accepted residual risks counted).
Optimistic starts (``Config(optimistic=...)``, ``--optimistic``): turbo's early
inline bodies are on, the opt-in background start is drawn per seed, and a body
run before a start that was then refused is counted as spec 9's residual risk
``body_before_refused_start`` (``invariants.residuals``; docs/turbo.md).
Issue 17's generators (``gen_*``, each with its ``invariants_*``; ``Config.generators``)
add child workflows (a child run is judged as a run of its own, ``collect``), timeouts,
attributes, streams, hook claims and limits; ``gen_schedules`` adds schedules (the
firing loop on for those seeds only) and ``invariants_schedules`` checks their firings.
Your own workflows can run on the same loop and World:
``loop.run(main, rng=random.Random(seed))`` with ``treadle.clock.use(SimClock(...))``
and a ``MemoryWorld``.
"""

from treadle.testing.simulation.faults import KINDS, FaultPlan
from treadle.testing.simulation.invariants import Violation
from treadle.testing.simulation.runner import Config, Report, simulate
from treadle.testing.simulation.shrink import shrink
from treadle.testing.simulation.workload import Shape

__all__ = ["KINDS", "Config", "FaultPlan", "Report", "Shape", "Violation", "shrink", "simulate"]
