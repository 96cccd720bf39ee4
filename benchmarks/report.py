"""The comparison table, the targets, the JSON result file and the chart of one invocation."""

from __future__ import annotations

import json
import math
import platform
import re
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks import stats
from benchmarks.runner import Outcome, Results

# treadle's World each peer is compared with: DBOS shares the Postgres, Vercel runs locally.
COMPARED_WITH = {"dbos": "postgres", "vercel": "local"}
COLUMNS = (("treadle", "local"), ("treadle", "postgres"), ("dbos", "postgres"), ("vercel", "local"))
FANOUT_LINES = (("first", ":", "v"), ("last", "-", "o"), ("join", "--", "s"))
# One colour per system and World in both panels of the chart.
COLORS = dict(zip(COLUMNS, ("tab:green", "tab:blue", "tab:orange", "tab:red"), strict=True))
METRIC_ORDER = (
    "ttfs", "stso_gap_ms", "ms_per_step@", "fanout", "runs_per_s@", "steps_per_s@",
    "recovery", "worker_rss", "orchestrator_rss", "wake_late", "woke_within",
    "sleeping_at_once", "delivery_ms@", "log_events@",
)  # fmt: skip


def _sort_key(name: str) -> tuple[int, int, int, str]:
    group = next((i for i, p in enumerate(METRIC_ORDER) if name.startswith(p)), 99)
    number = re.search(r"\d+", name)
    part = next((i for i, p in enumerate(("_first", "_last", "_join")) if p in name), 0)
    return group, int(number.group()) if number else 0, part, name


def summaries(results: Results) -> dict[str, dict[str, dict[str, dict[str, float | int]]]]:
    """``{system/world: {scenario: {metric: {p50, p90, n}}}}``."""
    out: dict[str, dict[str, dict[str, dict[str, float | int]]]] = {}
    for (system, world, scenario), outcome in results.items():
        out.setdefault(f"{system}/{world}", {})[scenario] = {
            name: stats.summary(values) for name, values in outcome.metrics.items()
        }
    return out


def _cell(outcome: Outcome | None, metric: str) -> str:
    if outcome is None:
        return "-"
    if outcome.unsupported is not None:
        return "n/a"
    values = outcome.metrics.get(metric)
    if not values:
        return "error" if outcome.errors else "-"
    p50, p90 = stats.percentile(values, 0.5), stats.percentile(values, 0.9)
    if len(values) == 1:
        return _num(p50)
    return f"{_num(p50)} ({_num(p90)})"


def _num(value: float) -> str:
    if math.isnan(value):
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def table(results: Results) -> str:
    """Markdown: p50 (p90) per system and World, and treadle's advantage over each peer."""
    metrics: dict[str, str] = {}
    for (_system, _world, scenario), outcome in results.items():
        for name in outcome.metrics:
            metrics[name] = scenario
    present = [c for c in COLUMNS if any((c[0], c[1], s) in results for s in metrics.values())]
    peers = [p for p in COMPARED_WITH if any(k[0] == p for k in results)]
    header = ["metric", *(f"{s} {w}" for s, w in present), *(f"vs {p}" for p in peers)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in sorted(metrics, key=_sort_key):
        scenario = metrics[name]
        row = [name]
        row += [_cell(results.get((s, w, scenario)), name) for s, w in present]
        for peer in peers:
            ours = results.get(("treadle", COMPARED_WITH[peer], scenario))
            theirs = results.get((peer, COMPARED_WITH[peer], scenario))
            row.append(_ratio(name, ours, theirs))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _ratio(metric: str, ours: Outcome | None, theirs: Outcome | None) -> str:
    if ours is None or theirs is None:
        return "-"
    if theirs.unsupported is not None:
        return "n/a"
    a, b = ours.metrics.get(metric), theirs.metrics.get(metric)
    if not a or not b:
        return "-"
    x = stats.advantage(metric, stats.percentile(a, 0.5), stats.percentile(b, 0.5))
    return "-" if math.isnan(x) else f"{x:.1f}x"


def _p50(results: Results, system: str, world: str, scenario: str, metric: str) -> float:
    outcome = results.get((system, world, scenario))
    values = outcome.metrics.get(metric) if outcome else None
    return stats.percentile(values, 0.5) if values else math.nan


def targets(results: Results) -> list[str]:
    """Where treadle stands against the issue's goals (goals, not assertions)."""
    lines: list[str] = []

    def check(text: str, value: float, goal: float, *, at_most: bool, unit: str) -> None:
        if math.isnan(value):
            return
        met = value <= goal if at_most else value >= goal
        sign = "<=" if at_most else ">="
        verdict = "met" if met else "NOT met"
        lines.append(f"{text}: {_num(value)} {unit} (goal {sign} {goal:g}) {verdict}")

    for world, goal in (("postgres", 1.0), ("local", 0.5)):
        for n in (250, 1000, 2000):
            value = _p50(results, "treadle", world, "stso", f"ms_per_step@{n}")
            check(f"STSO {world}, {n} steps", value, goal, at_most=True, unit="ms/step")
        low = _p50(results, "treadle", world, "stso", "ms_per_step@250")
        high = _p50(results, "treadle", world, "stso", "ms_per_step@2000")
        check(f"STSO {world} flatness 2,000/250", high / low, 1.2, at_most=True, unit="x")
    for world in ("local", "postgres"):
        value = _p50(results, "treadle", world, "ttfs", "ttfs_ms")
        check(f"TTFS {world} p50", value, 5.0, at_most=True, unit="ms")
        for n, goal in ((100, 100.0), (1000, 1000.0)):
            value = _p50(results, "treadle", world, "fanout", f"fanout{n}_last_ms")
            check(f"fan-out {n} TTLS {world}", value, goal, at_most=True, unit="ms")
        for steps, goal in ((1, 500.0), (10, 70.0)):
            value = _p50(results, "treadle", world, "throughput", f"runs_per_s@{steps}step")
            check(f"{steps}-step workflows/s {world}", value, goal, at_most=False, unit="/s")
    for (system, _world, scenario), theirs in results.items():
        if system != "dbos":
            continue
        for metric in theirs.metrics:
            ours = _p50(results, "treadle", "postgres", scenario, metric)
            peer = stats.percentile(theirs.metrics[metric], 0.5)
            check(f"vs DBOS {metric}", stats.advantage(metric, ours, peer), 5.0,
                  at_most=False, unit="x")  # fmt: skip
    return lines


def _versions() -> dict[str, str]:
    out = {}
    for package in ("treadle", "dbos", "vercel-workflow", "asyncpg", "nats-py", "matplotlib"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "not installed"
    return out


def machine() -> dict[str, Any]:
    import os

    return {
        "platform": platform.platform(),
        "processor": _cpu_model(),
        "cpus": os.cpu_count(),
        # Other work on the machine moves the figures: the 1, 5, 15-minute load at the end.
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "versions": _versions(),
        # The engine measured is the working tree: its commit, "-dirty" with changes on top.
        "treadle_commit": _commit(),
    }


def _commit() -> str:
    import subprocess

    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        ["git", "describe", "--always", "--dirty", "--abbrev=12"],
        cwd=root, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return result.stdout.strip() or "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_json(path: Path) -> Results:
    """The results a ``write_json`` file holds (to print and draw them again)."""
    document = json.loads(path.read_text())
    results: Results = {}
    for run in document["runs"]:
        outcome = Outcome(notes=run["notes"], errors=run["errors"], seconds=run["seconds"])
        outcome.unsupported = run["unsupported"]
        outcome.metrics.update(run["samples"])
        results[(run["system"], run["world"], run["scenario"])] = outcome
    return results


def write_json(
    path: Path,
    results: Results,
    *,
    started: datetime,
    seconds: float,
    mode: str,
    settings: dict[str, Any],
    caps: list[str],
) -> None:
    document = {
        "started": started.isoformat(),
        "finished": datetime.now(UTC).isoformat(),
        "seconds": round(seconds, 1),
        "mode": mode,
        "machine": machine(),
        "settings": settings,
        "caps": caps,
        "summary": summaries(results),
        "runs": [
            {
                "system": system,
                "world": world,
                "scenario": scenario,
                "notes": outcome.notes,
                "errors": outcome.errors,
                "unsupported": outcome.unsupported,
                "seconds": round(outcome.seconds, 1),
                "samples": dict(outcome.metrics),
            }
            for (system, world, scenario), outcome in results.items()
        ],
    }
    path.write_text(json.dumps(document, indent=1) + "\n")


def chart(path: Path, results: Results) -> str | None:
    """Draw STSO ms/step against steps, fan-out times against branches, and the scale
    scenarios (runs/s against workers, ms per delivery against events, RSS, lateness);
    why not, if not."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        return "no chart: matplotlib is not installed (pip install -e '.[bench]')"

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(18, 9.5))
    (left, right, scaling), (history, memory, lateness) = axes
    drawn = False
    bars: dict[str, dict[str, float]] = {"memory": {}, "lateness": {}}
    for (system, world, scenario), outcome in sorted(results.items()):
        name = f"{system} {world}"
        color = COLORS.get((system, world))
        p50 = {k: stats.percentile(v, 0.5) for k, v in outcome.metrics.items() if v}
        if scenario == "stso":
            points = sorted((int(k.split("@")[1]), v) for k, v in p50.items()
                            if k.startswith("ms_per_step@"))  # fmt: skip
            if points:
                left.plot(*zip(*points, strict=True), marker="o", color=color, label=name)
                drawn = True
        if scenario == "fanout":
            for part, style, marker in FANOUT_LINES:
                points = sorted((int(re.findall(r"\d+", k)[0]), v) for k, v in p50.items()
                                if k.endswith(f"_{part}_ms"))  # fmt: skip
                if points:
                    right.plot(*zip(*points, strict=True), style, marker=marker, color=color,
                               label=f"{name} {part}")  # fmt: skip
                    drawn = True
        if scenario == "workers":
            for steps, style in ((1, "-"), (10, "--")):
                points = sorted((int(k.rsplit("@", 1)[1].rstrip("w")), v) for k, v in p50.items()
                                if k.startswith(f"runs_per_s@{steps}step@"))  # fmt: skip
                if points:
                    scaling.plot(*zip(*points, strict=True), style, marker="o", color=color,
                                 label=f"{name} {steps}-step")  # fmt: skip
                    drawn = True
        if scenario == "history":
            points = sorted((int(re.findall(r"\d+", k)[0]), v) for k, v in p50.items()
                            if k.startswith("delivery_ms@"))  # fmt: skip
            if points:
                history.plot(*zip(*points, strict=True), marker="o", color=color, label=name)
                drawn = True
        if scenario == "memory":
            for k, v in p50.items():
                if "_rss_mib@" in k:
                    bars["memory"][f"{name}|{k.replace('_rss_mib@', ' @')}"] = v
        if scenario == "sleepers":
            for k, v in p50.items():
                if k.startswith("wake_late_"):
                    bars["lateness"][f"{name}|{k[len('wake_late_') : -len('_ms')]}"] = v
    drawn = _bars(memory, bars["memory"]) or drawn
    drawn = _bars(lateness, bars["lateness"]) or drawn
    left.set(title="STSO: ms per sequential step (p50)", xlabel="steps", ylabel="ms / step")
    right.set(title="Fan-out: to first, last branch start and join (p50)", xlabel="branches",
              ylabel="ms")  # fmt: skip
    scaling.set(title="Throughput against worker processes (Postgres)", xlabel="worker processes",
                ylabel="runs / s")  # fmt: skip
    history.set(title="One delivery against the run's log (p50)", xlabel="events in the log",
                ylabel="ms per delivery")  # fmt: skip
    memory.set(title="RSS of one worker process (MiB)", ylabel="MiB")
    lateness.set(title="Sleeping runs: first step after the sleep, late by (ms)", ylabel="ms")
    for ax in (left, right):
        ax.set_yscale("log")
    for ax in (right, history):
        ax.set_xscale("log")
    lateness.set_yscale("symlog", linthresh=10)
    history.set_ylim(bottom=0)
    scaling.set_ylim(bottom=0)
    scaling.xaxis.get_major_locator().set_params(integer=True)
    for ax in (left, right, scaling, history, memory, lateness):
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    if drawn:
        fig.savefig(path, dpi=100)
    plt.close(fig)
    return None if drawn else "no chart: no results to draw"


def _bars(ax: Any, values: dict[str, float]) -> bool:
    """Grouped bars: one group per measure (after ``|``), one bar per system and World."""
    if not values:
        return False
    systems = sorted({k.split("|")[0] for k in values})
    measures = list(dict.fromkeys(k.split("|")[1] for k in values))  # in the order measured
    width = 0.8 / len(systems)
    for i, system in enumerate(systems):
        xs = [m + i * width for m in range(len(measures))]
        ys = [values.get(f"{system}|{m}", math.nan) for m in measures]
        color = COLORS.get(tuple(system.split(" ")))  # type: ignore[arg-type]
        ax.bar(xs, ys, width, label=system, color=color)
    ax.set_xticks([m + 0.4 - width / 2 for m in range(len(measures))])
    ax.set_xticklabels(measures, fontsize=7, rotation=15)
    return True
