"""What one invocation runs: each system's scenarios, their sizes and repeats.

The full plan is the seed's suite (seed 003 "Benchmarks", DESIGN.md section 8);
``quick`` shrinks it to tiny sizes, one repeat, treadle only, to keep the
harness working (``tests/benchmarks``). Where a peer runs a smaller size than
treadle, the plan says so and why (``caps``), and the report prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCENARIOS = (
    "ttfs", "stso", "fanout", "throughput", "recovery",
    # Issue 15 item 5: scale, not only speed (benchmarks.scale).
    "workers", "memory", "sleepers", "history",
)  # fmt: skip
SYSTEMS = ("treadle", "dbos", "vercel")
# Where each system runs: treadle on both Worlds; DBOS on the same Postgres; Vercel locally.
WORLDS = {"treadle": ("local", "postgres"), "dbos": ("postgres",), "vercel": ("local",)}


@dataclass(frozen=True)
class Job:
    """One child process: a scenario of a system on a World, one repeat."""

    system: str
    world: str
    scenario: str
    repeat: int
    params: dict[str, Any]
    timeout: float

    @property
    def label(self) -> str:
        return f"{self.system}/{self.world}/{self.scenario}#{self.repeat + 1}"


@dataclass
class Plan:
    jobs: list[Job]
    caps: list[str] = field(default_factory=list)


FULL: dict[str, Any] = {
    # Sized so the whole suite (three systems) ends within 15 minutes on 2 cores.
    "repeats": {
        **{"ttfs": 3, "stso": 2, "fanout": 3, "throughput": 2, "recovery": 1},
        **{"workers": 1, "memory": 1, "sleepers": 1, "history": 1},
    },
    "warmup": 3,
    "samples": 20,
    "sizes": [250, 1000, 2000],
    "gap_size": 1000,
    "widths": [100, 1000],
    "throughput": {"one": 1000, "ten": 200, "starters": 8},
    # treadle runs with the default lease (30 s) and liveness (3 s): what a user gets.
    "recovery": {"kills": 3, "vercel_wait_seconds": 20.0},
    "workers": 2,
    # The scale scenarios (benchmarks.scale); SCALE_CAPS says what is smaller than the
    # issue's sizes and why.
    "workers_scale": {"counts": [1, 2, 4], "one": 500, "ten": 100, "starters": 8},
    "memory": {"sleeping": 10_000, "runs": 5000, "chunks": 5, "starters": 8},
    "sleepers": {"count": 10_000, "rate": 150, "delay_seconds": 75.0, "starters": 16},
    "history": {"events": [100, 1000, 10_000], "waits": 5, "settle_seconds": 0.05},
}

QUICK: dict[str, Any] = {
    "repeats": dict.fromkeys(SCENARIOS, 1),
    "warmup": 1,
    "samples": 3,
    "sizes": [20, 40],
    "gap_size": 40,
    "widths": [10],
    "throughput": {"one": 20, "ten": 5, "starters": 2},
    "recovery": {"kills": 1, "vercel_wait_seconds": 5.0},
    "workers": 2,
    "workers_scale": {"counts": [1, 2], "one": 20, "ten": 5, "starters": 2},
    "memory": {"sleeping": 1000, "runs": 5000, "chunks": 5, "starters": 8},
    "sleepers": {"count": 100, "rate": 50, "delay_seconds": 4.0, "starters": 8},
    "history": {"events": [20, 100], "waits": 2, "settle_seconds": 0.05},
}

# The sizes where the full suite runs smaller ones, with the reason printed
# (``--scale-full`` runs these instead).
SCALE_FULL: dict[str, Any] = {
    "memory": {**FULL["memory"], "runs": 100_000},
}
SCALE_CAPS = [
    "orchestrator RSS after 5,000 one-step runs, not 100,000: one worker process runs "
    "50 to 100 a second here, so 100,000 would take 17 to 35 minutes per system; the "
    "growth per 1,000 runs (from the first 1,000 to the last) is reported, and "
    "--scale-full runs 100,000",
]

# Sizes a peer runs instead of treadle's, with the reason the report prints.
PEER_CAPS: dict[str, dict[str, Any]] = {
    "dbos": {
        "repeats": (
            {**FULL["repeats"], "stso": 1},
            "DBOS STSO run once: its 3,250 sequential steps take about a minute",
        ),
    },
    "vercel": {
        "sizes": (
            [100, 250],
            "Vercel STSO at 100 and 250 steps only, once: its local World replays the whole "
            "history per step (measured here: 191 ms per step at 250 steps, 491 at 500; a "
            "500-step run alone took 4 minutes), so 1,000 and 2,000 steps cannot fit",
        ),
        "gap_size": (250, "Vercel step-to-step gaps from its 250-step run (not 1,000)"),
        "widths": (
            [100],
            "Vercel fan-out at 100 branches only: measured here, its last branch starts "
            "4.9 s and its join 7.2 s after the start at 100, so 1,000 cannot fit",
        ),
        "throughput": (
            {"one": 60, "ten": 10, "starters": 4},
            "Vercel throughput on 60 one-step and 10 ten-step runs (it runs 17 to 46 "
            "runs/s and slows down as one process accumulates runs)",
        ),
        "repeats": (
            {**FULL["repeats"], "stso": 1, "fanout": 2},
            "Vercel STSO run once and fan-out twice (a 100-way fan-out child takes it about 40 s)",
        ),
    },
}

# Where the scale scenarios run (the others run on every system and World).
SCALE_ON_POSTGRES = ("workers", "memory", "sleepers")
SCALE_SYSTEMS = ("treadle", "dbos")
SCALE_SKIPS = {
    "vercel": "Vercel runs no scale scenario: its local World keeps the queue in one "
    "process's memory (no worker processes to add) and its time per step grows with "
    "the history (see its STSO cap), so 10,000 runs or events cannot fit",
    "local": "treadle's local World runs only the history scale scenario: it serves one "
    "process, and the workers, memory and sleepers scenarios measure worker processes",
}


def runs_here(system: str, world: str, scenario: str) -> bool:
    """Whether the plan schedules ``scenario`` of ``system`` on ``world``."""
    if scenario not in ("workers", "memory", "sleepers", "history"):
        return True
    if system not in SCALE_SYSTEMS:
        return False
    return world == "postgres" or scenario not in SCALE_ON_POSTGRES


TIMEOUT_SECONDS = {
    "ttfs": 120, "stso": 420, "fanout": 300, "throughput": 300, "recovery": 240,
    "workers": 600, "memory": 1200, "sleepers": 900, "history": 600,
}  # fmt: skip


def build(
    *,
    quick: bool,
    systems: tuple[str, ...],
    worlds: tuple[str, ...],
    scenarios: tuple[str, ...],
    repeats: int | None,
    scale_full: bool = False,
) -> Plan:
    base = QUICK if quick else FULL
    plan = Plan(jobs=[])
    if scale_full:
        base = {**base, **SCALE_FULL}
    elif not quick and any(s in scenarios for s in SCALE_FULL):
        plan.caps.extend(SCALE_CAPS)
    for system in systems:
        params = dict(base)
        if not quick:
            for key, (value, reason) in PEER_CAPS.get(system, {}).items():
                params[key] = value
                plan.caps.append(reason)
        for world in WORLDS[system]:
            if world not in worlds:
                continue
            for scenario in scenarios:
                if not runs_here(system, world, scenario):
                    skip = SCALE_SKIPS["vercel" if system == "vercel" else "local"]
                    if skip not in plan.caps:
                        plan.caps.append(skip)
                    continue
                count = repeats or params["repeats"][scenario]
                for repeat in range(count):
                    job_params = {k: v for k, v in params.items() if k != "repeats"}
                    plan.jobs.append(
                        Job(
                            system=system,
                            world=world,
                            scenario=scenario,
                            repeat=repeat,
                            params={**job_params, "world": world},
                            timeout=TIMEOUT_SECONDS[scenario]
                            * (0.5 if quick else 10 if scale_full else 1),
                        )
                    )
    return plan
