"""``python -m benchmarks`` (and ``treadle bench``): run the suite, print the comparison,
write ``results/<time>.json`` and ``results/<time>.png``.

Exit codes: 0 every job ran (a peer that cannot run a scenario is reported, not
an error); 1 a job failed or timed out; 2 a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

from benchmarks import plan, report, servers
from benchmarks.runner import Outcome, Results, run_job

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _choices(text: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [c for c in chosen if c not in allowed]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"takes a comma-separated list of {', '.join(allowed)}, not {text!r}"
        )
    return chosen


class Parser(argparse.ArgumentParser):
    """Usage errors are one line on stderr, exit 2 (as the ``treadle`` command's)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"python -m benchmarks: error: {message} (see: --help)\n")
        raise SystemExit(2)


def build_parser() -> Parser:
    parser = Parser(
        prog="python -m benchmarks",
        description="treadle against DBOS and the Vercel Workflow Python SDK: TTFS, STSO, "
        "fan-out, throughput and recovery, and the scale scenarios (workers, memory, "
        "sleepers, history), each in a fresh process.",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 repeat, treadle only")
    parser.add_argument(
        "--systems",
        type=lambda t: _choices(t, plan.SYSTEMS),
        help="comma-separated: treadle,dbos,vercel (default all; --quick: treadle)",
    )
    parser.add_argument(
        "--worlds",
        type=lambda t: _choices(t, ("local", "postgres")),
        default=("local", "postgres"),
        help="comma-separated: local,postgres (default both)",
    )
    parser.add_argument(
        "--scenarios",
        type=lambda t: _choices(t, plan.SCENARIOS),
        default=plan.SCENARIOS,
        help=f"comma-separated: {','.join(plan.SCENARIOS)} (default all)",
    )
    parser.add_argument("--repeats", type=int, metavar="N", help="override every repeat count")
    parser.add_argument(
        "--pg-fast",
        action="store_true",
        help="run PostgreSQL with fsync and synchronous_commit off (default: durable settings)",
    )
    parser.add_argument(
        "--scale-full",
        action="store_true",
        help="the scale scenarios at the issue's sizes where the suite runs smaller ones "
        "(the orchestrator's RSS after 100,000 runs): adds about 30 minutes",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where results go")
    parser.add_argument(
        "--from",
        dest="from_json",
        type=Path,
        metavar="JSON",
        help="run nothing: print the comparison of an earlier result file and redraw its chart",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats must be at least 1, not {args.repeats}")
    if args.from_json is not None:
        if not args.from_json.is_file():
            parser.error(f"--from: no result file at {args.from_json}")
        earlier = report.load_json(args.from_json)
        png_path = args.from_json.with_suffix(".png")
        _print_report(earlier)
        print(report.chart(png_path, earlier) or f"chart: {png_path}")
        return 0
    systems = args.systems or (("treadle",) if args.quick else plan.SYSTEMS)
    suite = plan.build(
        quick=args.quick,
        systems=systems,
        worlds=args.worlds,
        scenarios=args.scenarios,
        repeats=args.repeats,
        scale_full=args.scale_full,
    )
    if not suite.jobs:
        parser.error("nothing to run: no chosen system runs on the chosen worlds")
    args.out.mkdir(parents=True, exist_ok=True)
    started_at = datetime.now(UTC)
    started = time.monotonic()
    mode = "quick" if args.quick else "full"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    _say(
        f"treadle bench ({mode}): {len(suite.jobs)} child processes, {', '.join(systems)} "
        f"(load average {load})"
    )
    for cap in suite.caps:
        _say(f"  cap: {cap}")
    results: Results = {}
    needs_servers = any(job.world == "postgres" for job in suite.jobs)
    try:
        with _servers(needs_servers, durable=not args.pg_fast) as running, _workdir() as workdir:
            for i, job in enumerate(suite.jobs, 1):
                result, seconds = run_job(job, running, workdir)
                outcome = results.setdefault((job.system, job.world, job.scenario), Outcome())
                outcome.add(result, seconds)
                status = (
                    f"n/a: {result['unsupported']}"
                    if "unsupported" in result
                    else f"ERROR: {result['error']}"
                    if "error" in result
                    else "ok"
                )
                _say(f"[{i}/{len(suite.jobs)}] {job.label} {seconds:.1f} s {status}")
    except servers.ServersUnavailable as exc:
        _say(f"python -m benchmarks: error: {exc}")
        return 1
    elapsed = time.monotonic() - started
    stamp = started_at.strftime("%Y%m%dT%H%M%SZ") + ("-quick" if args.quick else "")
    json_path = args.out / f"{stamp}.json"
    png_path = args.out / f"{stamp}.png"
    settings = {
        "postgres": "fast (fsync off)" if args.pg_fast else "durable (defaults)",
        "plan": {k: v for k, v in (plan.QUICK if args.quick else plan.FULL).items()}
        | (plan.SCALE_FULL if args.scale_full else {}),
    }
    report.write_json(
        json_path, results, started=started_at, seconds=elapsed, mode=mode,
        settings=settings, caps=suite.caps,
    )  # fmt: skip
    no_chart = report.chart(png_path, results)
    _print_report(results)
    print(f"{elapsed:.0f} s; results: {json_path}; " + (no_chart or f"chart: {png_path}"))
    failed = any(outcome.errors for outcome in results.values())
    return 1 if failed else 0


def _print_report(results: Results) -> None:
    print()
    print(report.table(results))
    print()
    for (system, world, scenario), outcome in results.items():
        for note in outcome.notes:
            print(f"- {system} {world} {scenario}: {note}")
        if outcome.unsupported:
            print(f"- {system} {world} {scenario}: cannot run: {outcome.unsupported}")
        for error in outcome.errors:
            print(f"- {system} {world} {scenario}: ERROR {error}")
    print()
    print("Targets (goals, not assertions):")
    for line in report.targets(results):
        print(f"- {line}")
    print()


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _servers(needed: bool, *, durable: bool) -> Iterator[servers.Servers | None]:
    if not needed:
        yield None
        return
    _say(f"starting PostgreSQL ({'durable' if durable else 'fast'}) and nats-server")
    with servers.started(durable=durable) as running:
        yield running


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="treadle-bench-run-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
