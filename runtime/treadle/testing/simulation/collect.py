"""What one run left behind, collected after the simulation for the invariants
(``invariants.RunOutcome``): its record and log, its bodies and deliveries, the faults
that touched it and, for a parent, each child run it started (as a run of its own).
"""

from __future__ import annotations

from typing import Any

from treadle.testing.simulation import invariants, invariants_children, workload
from treadle.world import contract


async def run_outcome(
    sim: Any,
    world: contract.World,
    run_id: str,
    program: workload.Program,
    span: tuple[float, float] | None = None,
) -> invariants.RunOutcome:
    rec = await world.runs.get(run_id)
    start, end = span or (sim.started.get(run_id, 0.0), sim.ended.get(run_id, float("inf")))
    tainted = any(start <= t <= end and r in (None, run_id) for t, r in sim.ownership_lost)
    stats = sim.backend.stats
    per_run = getattr(stats, "per_run", {}).get(run_id)
    found = invariants.RunOutcome(
        run_id=run_id,
        program=program,
        record=rec,
        log=list(sim.backend.events_of(run_id)),
        bodies=sim.ledger.of_run(run_id),
        tainted=tainted,
        cancelled_by_actor=run_id in sim.cancelled,
        deliveries=int(getattr(per_run, "deliveries", 0)),
        handoffs=int(getattr(per_run, "handoffs", 0)),
        dead_processes={p.name for p in sim.processes.values() if p.dead},
        killed_at={p.name: p.killed_at for p in sim.processes.values()},
        stalls={p.name: list(p.stalls) for p in sim.processes.values()},
        ignored_leases=[str(i) for i in sim.ignored_leases if i.run_id == run_id],
        owner_died=any(
            p.killed_at is not None and start <= p.killed_at <= end for p in sim.processes.values()
        ),
        spec_version=rec.spec_version,
        ownership_lease=sim.config.ownership_lease,
        faults_on_run=sum(
            1
            for f in sim.injector.log
            if f.run_id == run_id or (f.run_id is None and start <= f.at <= end)
        ),
        messages_left=len(sim.backend.messages_of(run_id)),
        cut_at=sim.now(),
        delivery_runs=sim.ledger.deliveries_of(run_id),
        keyed_sends=[(k.world, k.key, k.ok) for k in sim.backend.keyed_sends if k.run_id == run_id],
    )
    found.children = await invariants_children.collect(
        found, sim.backend, lambda cid, ops, at: run_outcome(sim, world, cid, ops, at)
    )
    return found
