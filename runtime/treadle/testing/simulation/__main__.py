"""``python -m treadle.testing.simulation``: soak many seeds, or replay one verbosely.

    python -m treadle.testing.simulation --seeds 200 [--start 0]   # soak
    python -m treadle.testing.simulation --seed 17 [--plan 'kill=0.01,budget=4'] [--shrink]

A soak prints one line per failing seed (with its replay command) and then
runs/s, simulated seconds, faults injected by kind, deliveries and handoffs,
the violations by kind, and for spec 8 runs their count, seed 000's residual
risks met (counted, never failed) and owned recoveries, backstops armed and
single-flight absorptions; it exits 1 when any seed failed. A replay prints
the programs, the plan, every fault and step body, and each violation.

``--spec 9|8|mixed`` picks the run formats (default: mixed, each run spec 8 or 9,
on a build that drives spec 8; 9 otherwise); ``--no-ownership`` runs spec 8 under
the kill switch ``WORKFLOW_INLINE_OWNERSHIP=0`` (issue #2780 comes back).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
import time

from treadle.testing.simulation import known, spec8, workload
from treadle.testing.simulation.faults import FaultPlan
from treadle.testing.simulation.runner import GENERATORS, OPTIMISTIC, Config, Report, simulate
from treadle.testing.simulation.shrink import shrink


def _config(args: argparse.Namespace) -> Config:
    shape = workload.Shape(max_ops=args.ops)
    plan = FaultPlan.parse(args.plan) if args.plan is not None else None
    if args.spec in ("8", "mixed") and not spec8.supported():
        raise SystemExit(f"--spec {args.spec}: this build does not drive spec 8 runs yet")
    return Config(
        runs=args.runs,
        processes=args.processes,
        shape=shape,
        plan=plan,
        spec=args.spec,
        optimistic=args.optimistic,
        ownership=not args.no_ownership,
        ownership_lease=args.lease,
        run_ahead=args.run_ahead,
        warm=args.warm,
        generators=() if args.no_features else _generators(args.generators),
        children=not args.no_children,
        hook_claims=not args.no_hook_claims,
    )


def _spec9_line(residuals: collections.Counter[str]) -> str:
    """Spec 9's residual risk: bodies run before an optimistic start that was refused."""
    shown = {"body_before_refused_start": residuals.get("body_before_refused_start", 0)}
    return f"spec 9: residual risks (counted, not failed): {shown}"


def _spec8_line(
    runs8: int, residuals: collections.Counter[str], notes: collections.Counter[str]
) -> str:
    shown = {k: residuals.get(k, 0) for k in ("redelivery_while_alive", "longer_than_lease")}
    return (
        f"spec 8: {runs8} runs; residual risks (counted, not failed): {shown}; "
        f"{dict(sorted(notes.items()))}"
    )


def _run_ahead_line(counts: collections.Counter[str], *, depth: int | None = None) -> str:
    """Run-ahead's counts, with seed 003's one documented double-run case shown apart."""
    at_risk = counts.get("bodies_at_risk", 0)
    rest = {k: v for k, v in sorted(counts.items()) if k != "bodies_at_risk"}
    shown = "" if depth is None else f"depth {depth}; "
    return (
        f"run-ahead: {shown}{rest}; residual risk (counted, not failed): {at_risk} bodies of "
        "refused speculative creations the restarted pass may run again"
    )


def _replay(seed: int, args: argparse.Namespace) -> int:
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    report = simulate(seed, _config(args))
    if args.shrink and not report.ok:
        report = shrink(report, on_step=lambda r: print(f"shrunk: {r.replay_command()}"))
    print(
        f"seed {seed}: plan {report.plan}; {report.runs} runs, "
        f"{report.sim_seconds:.0f} simulated s in {report.real_seconds:.2f} s"
    )
    for i, program in enumerate(report.programs):
        print(f"program {i}: {json.dumps(program.ops)}")
        print(f"  actors: {[(a.at, a.kind, a.token, a.n) for a in program.actors]}")
    for line in report.trace:
        print(f"  {line}")
    print(
        f"faults: {dict(report.faults)}; deliveries per run: {report.deliveries}; "
        f"handoffs: {report.handoffs}"
    )
    print(_spec9_line(report.residuals))
    if report.spec8_runs:
        print(_spec8_line(report.spec8_runs, report.residuals, report.spec8_notes))
    print(_run_ahead_line(report.run_ahead, depth=report.run_ahead_depth))
    print(f"warm sessions: {report.warm_settings}; {dict(sorted(report.warm.items()))}")
    print(f"schedules: {dict(sorted(report.schedules.items()))}")
    for v in report.violations:
        print(f"VIOLATION {v}  (likely {known.classify(v, report)})")
    if not report.ok:
        print(f"replay: {report.replay_command()}")
    return 0 if report.ok else 1


def _soak(args: argparse.Namespace) -> int:
    config = _config(args)
    t0 = time.monotonic()
    faults: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    runs = deliveries = handoffs = runs8 = 0
    residuals: collections.Counter[str] = collections.Counter()
    notes: collections.Counter[str] = collections.Counter()
    ahead: collections.Counter[str] = collections.Counter()
    ahead_seeds = 0
    warm_counts: collections.Counter[str] = collections.Counter()
    schedule_counts: collections.Counter[str] = collections.Counter()
    sim_seconds = 0.0
    failed: list[Report] = []
    for seed in range(args.start, args.start + args.seeds):
        report = simulate(seed, config)
        runs += report.runs
        sim_seconds += report.sim_seconds
        faults.update(report.faults)
        deliveries += sum(report.deliveries.values())
        handoffs += report.handoffs
        runs8 += report.spec8_runs
        residuals.update(report.residuals)
        notes.update(report.spec8_notes)
        ahead.update(report.run_ahead)
        ahead_seeds += report.run_ahead_depth > 0
        warm_counts.update(report.warm)
        schedule_counts.update(report.schedules)
        if args.json:
            line = {
                "seed": seed,
                "ok": report.ok,
                "violations": [str(v) for v in report.violations],
                "labels": known.labels(report) if not report.ok else [],
                "replay": report.replay_command(),
                "faults": dict(report.faults),
                "spec8_runs": report.spec8_runs,
                "residuals": dict(report.residuals),
                "run_ahead": {"depth": report.run_ahead_depth, **report.run_ahead},
            }
            print(json.dumps(line))
            sys.stdout.flush()
            if not report.ok:
                failed.append(report)
            continue
        if not report.ok:
            failed.append(report)
            kinds.update({v.kind for v in report.violations})
            print(
                f"FAIL seed {seed}: {report.violations[0]}  ({len(report.violations)} violations)"
            )
            print(f"  likely: {'; '.join(known.labels(report))}")
            print(f"  replay: {report.replay_command()}")
            sys.stdout.flush()
    took = time.monotonic() - t0
    if args.json:
        return 1 if failed else 0
    print(
        f"{args.seeds} seeds, {runs} runs in {took:.1f} s ({runs / took:.1f} runs/s), "
        f"{sim_seconds:.0f} simulated s; {deliveries} deliveries, {handoffs} handoffs"
    )
    print(f"faults injected: {dict(sorted(faults.items()))} (total {sum(faults.values())})")
    print(f"failing seeds: {len(failed)}; violations by kind: {dict(kinds)}")
    print(_spec9_line(residuals))
    print(_spec8_line(runs8, residuals, notes))
    print(f"{ahead_seeds} seeds with run-ahead on; " + _run_ahead_line(ahead))
    print(f"warm sessions: {dict(sorted(warm_counts.items()))}")
    print(f"schedules: {dict(sorted(schedule_counts.items()))}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m treadle.testing.simulation", description=__doc__.split("\n")[0]
    )
    p.add_argument("--seeds", type=int, help="soak: run this many seeds")
    p.add_argument("--start", type=int, default=0, help="first seed of a soak")
    p.add_argument("--seed", type=int, help="replay one seed, verbosely")
    p.add_argument("--plan", help="fault plan, e.g. 'kill=0.01,stall=0.004,budget=6' or 'none'")
    p.add_argument("--runs", type=int, default=Config.runs, help="runs per seed")
    p.add_argument("--processes", type=int, default=Config.processes, help="worker processes")
    p.add_argument(
        "--ops", type=int, default=workload.Shape.max_ops, help="most operations per program"
    )
    p.add_argument("--shrink", action="store_true", help="shrink a failing --seed")
    p.add_argument("-v", "--verbose", action="store_true", help="engine logs (INFO)")
    p.add_argument("--json", action="store_true", help="soak: one JSON object per seed")
    p.add_argument(
        "--spec",
        choices=spec8.MODES,
        default=spec8.default_mode(),
        help="run formats: 9, 8, or mixed (each run either; the default where spec 8 runs)",
    )
    p.add_argument(
        "--optimistic",
        choices=OPTIMISTIC,
        default=Config.optimistic,
        help="optimistic starts: seed (background start drawn per seed), default, on, off",
    )
    p.add_argument(
        "--lease",
        type=float,
        default=Config.ownership_lease,
        help="spec 8: WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS in virtual seconds (1 to 900)",
    )
    p.add_argument(
        "--no-features",
        action="store_true",
        help="none of issue 17's generators (attributes, children, timeouts, streams, hook "
        "claims, limits): programs as seeds pinned before them drew",
    )
    p.add_argument(
        "--generators",
        default=None,
        help="comma-separated: only these of issue 17's generators (default: all)",
    )
    p.add_argument(
        "--no-children",
        action="store_true",
        help="draw no child workflows (gen_children) into the programs",
    )
    p.add_argument(
        "--no-ownership",
        action="store_true",
        help="spec 8 under the kill switch WORKFLOW_INLINE_OWNERSHIP=0",
    )
    p.add_argument(
        "--no-hook-claims",
        action="store_true",
        help="no generated hook force-claims (gen_hookclaims), as seeds pinned before them",
    )
    p.add_argument(
        "--run-ahead",
        type=int,
        default=None,
        help="WORKFLOW_RUN_AHEAD_DEPTH for every seed (default: drawn per seed, 0 or 10)",
    )
    p.add_argument(
        "--warm",
        type=int,
        default=None,
        help="TREADLE_WARM_RUNS for every seed (default: drawn per seed, 0, 1 or the default)",
    )
    args = p.parse_args(argv)
    # No hash seed is fixed: the engine and the simulation never iterate a set of
    # strings in hash order, so a seed replays the same under any PYTHONHASHSEED.
    if not args.verbose:
        logging.getLogger("treadle").setLevel(logging.CRITICAL)
    if args.seed is not None:
        return _replay(args.seed, args)
    if args.seeds is not None:
        return _soak(args)
    p.error("give --seeds N or --seed S")
    return 2


def _generators(raw: str | None) -> tuple[str, ...] | None:
    if raw is None:
        return None
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    unknown = [n for n in names if n not in GENERATORS]
    if unknown:
        known_ = ", ".join(GENERATORS)
        raise SystemExit(f"--generators: unknown {', '.join(unknown)} (known: {known_})")
    return names


if __name__ == "__main__":
    sys.exit(main())
