"""The deterministic simulation (DESIGN.md section 10; issue 10, Deliver item 1).

A fixed seed set runs the real orchestrator on the memory World under seeded
faults and must hold every invariant (``KNOWN_FAILING`` would list a seed
showing a known, unfixed bug; it is empty: seed 35, listed in session 8, was the
simulation's model, docs/plans/s9-sim.md). ``PINNED`` replays seeds that once
found a bug, each under the fault plan it failed with. The other tests keep the simulation
honest: one seed replays to the same trace, planted defects in known-correct
orchestrator rules are reported with their seed, a held loop is a violation,
virtual time costs no real time, and shrinking keeps the failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from typing import Any

import pytest

from treadle import clock
from treadle.orchestrator import decisions, runtime
from treadle.sdk import functions
from treadle.testing.simulation import Config, FaultPlan, Shape, loop, shrink, simulate

CI_SEEDS = list(range(200))

# What each bug fixed this session looked like in the simulation, and the seeds that
# found it (0-199 all pass now; reverting a fix makes these fail again): bug 1 seeds 1, 5,
# 14, 17 (overlap, false StepAttemptsExhausted), bug 2 seeds 22, 36 (cancelled_body), bug 3
# seed 22 (exhausted_unrun), bug 4 seed 39 (loop_held), bug 6 seed 0 (HookConflictError),
# F2 seed 18 (a second outcome); see found_seeds.md.
# seed -> a known bug it shows (empty: every seed of CI_SEEDS must pass).
KNOWN_FAILING: dict[int, str] = {}


UNKNOWN_START = (
    "an inline start committed by a creation batch whose write raised after committing is "
    "never run; the redelivery fails its max_retries=0 step as exhausted"
)
UNKNOWN_START_RELOAD = UNKNOWN_START + " (and a storage error follows it)"
UNKNOWN_BG_START = (
    "a background step's start write raises after committing; the redelivery fails the "
    "max_retries=0 step as exhausted, its body never run"
)
LOST_OUTCOME = (
    "a background step's last attempt returns, its outcome write fails once, and the "
    "redelivery fails the step as StepAttemptsExhausted"
)
LOST_INLINE_OUTCOME = (
    "an inline max_retries=0 step returns (or raises), its in-band outcome write fails "
    "with a storage error, the delivery fails, and the redelivery fails the step as "
    "StepAttemptsExhausted though its body ran"
)
RESEND_SKIPPED = (
    "a delivery's re-send fails and the message's next delivery, started in the same "
    "millisecond in the same process, takes itself for its re-run and skips the re-send: "
    "steps created but never sent never run"
)
STOPPED_WRITER = (
    "a sibling inline step's step_retrying commits and its write raises; the writer stops, "
    "a max_retries=0 body's later outcome is refused, and the redelivery fails it as "
    "StepAttemptsExhausted though it ran"
)

# Seeds found by soaks under their own fault plans, fixed since; each replays under its
# plan (in the CLI's fresh interpreter) and must hold every invariant.
OWN_HOOK_CONFLICT = (
    "expectation: a wake_up ends a race_hook's sleep, its hook stays open, and the next"
    " hook on that token conflicts with the run's own hook (seed 003 Hook conflicts)"
)
WAKE_AFTER_END = "World: a wake_up after the run ended wrote wake_requested after run_completed"
LEASE_LOST = "F3: a delivery that knows it lost its lease must stop writing and starting bodies"
BUG2_PLAN = "bug 2: a transient error cancels two running inline bodies"
STALE_START = (
    "World: a plain delivery's step_started stalls past its lease, lands after its "
    "redeliveries started attempts 1 and 2, and runs its body (attempt 1 after 2)"
)
FEED_DROP_NEWS = (
    "a linger whose feed pushed an outcome and dropped at once ended as 'nothing new'; the"
    " run was recorded consumed through it and the step's wake was taken for a no-op"
)
STEP_START_AFTER_LAPSE = (
    "a background step's deliveries, told their lease lapsed (their process stalled), "
    "wrote step_started and ran no body; two such starts spent a max_retries=1 step's "
    "attempts and the live redelivery failed it as exhausted, never run"
)
LIMIT_WAKE_KEY = (
    "limits: a woken waiter passed by a higher priority waits again, and a wake keyed per"
    " wait (not per release) never reaches it again"
)
LATE_HOOK_ACTOR = (
    "simulation: a resume sent long before its hook exists gave up after 200 tries; the"
    " actor now retries until the run ends"
)

PINNED: list[tuple[int, str, str]] = [
    (8, "duplicate=0.005,fail_after=0.01,queue_error=0.005,budget=20", UNKNOWN_BG_START),
    (
        216,
        "duplicate=0.01,fail_after=0.02,kill=0.008,lost_wake=0.004,queue_error=0.005,"
        "storage_error=0.02,budget=20",
        UNKNOWN_START_RELOAD,
    ),
    (232, "fail_after=0.01,feed_drop=0.0025,fence=0.003,queue_error=0.02,budget=12", UNKNOWN_START),
    (320, "feed_drop=0.0025,fence=0.012,storage_error=0.02,budget=4", LOST_OUTCOME),
    (113, "lost_wake=0.004,queue_error=0.02,storage_error=0.01,budget=20", OWN_HOOK_CONFLICT),
    (197, "fence=0.006,kill=0.004,budget=20", OWN_HOOK_CONFLICT),
    (215, "lost_wake=0.004,stall=0.003,budget=20", WAKE_AFTER_END),
    (336, "feed_drop=0.01,lost_wake=0.008,stall=0.003,budget=4", WAKE_AFTER_END),
    (338, "feed_drop=0.0025,kill=0.004,lost_wake=0.008,queue_error=0.02,budget=8", WAKE_AFTER_END),
    # Found by reverting a fix on a scratch branch and soaking seeds 0-999 (closing note).
    (
        740,
        "duplicate=0.02,fail_after=0.02,fence=0.006,lost_wake=0.004,queue_error=0.01,"
        "stall=0.006,storage_error=0.02,budget=12",
        LEASE_LOST,
    ),
    (
        826,
        "duplicate=0.02,fail_after=0.01,fence=0.012,kill=0.008,queue_error=0.005,"
        "storage_error=0.01,budget=4",
        LEASE_LOST,
    ),
    (
        63,
        "fail_after=0.005,feed_drop=0.0025,kill=0.008,lost_wake=0.002,queue_error=0.02,"
        "stall=0.003,storage_error=0.02,budget=20",
        BUG2_PLAN,
    ),
    (
        522,
        "fail_after=0.005,fence=0.012,queue_error=0.005,stall=0.006,storage_error=0.02,budget=12",
        STALE_START,
    ),
    (
        895,
        "duplicate=0.005,fail_after=0.005,lost_wake=0.002,queue_error=0.005,stall=0.0015,"
        "storage_error=0.02,budget=4",
        LOST_INLINE_OUTCOME,
    ),
    (
        2419,
        "duplicate=0.005,fail_after=0.005,feed_drop=0.0025,fence=0.006,storage_error=0.01,budget=4",
        LOST_INLINE_OUTCOME,
    ),
    (
        2700,
        "duplicate=0.02,kill=0.002,lost_wake=0.004,queue_error=0.005,storage_error=0.01,budget=20",
        LOST_INLINE_OUTCOME,
    ),
    (
        2716,
        "duplicate=0.01,fail_after=0.02,feed_drop=0.005,kill=0.004,stall=0.003,budget=4",
        STOPPED_WRITER,
    ),
    (
        477,
        "fail_after=0.02,feed_drop=0.005,fence=0.006,kill=0.008,lost_wake=0.008,stall=0.003,"
        "storage_error=0.02,budget=20",
        RESEND_SKIPPED,
    ),
    (
        1186,
        "duplicate=0.02,feed_drop=0.01,queue_error=0.02,storage_error=0.005,budget=12",
        RESEND_SKIPPED,
    ),
    (
        2123,
        "fail_after=0.02,feed_drop=0.01,fence=0.012,lost_wake=0.002,stall=0.0015,"
        "storage_error=0.02,budget=8",
        RESEND_SKIPPED,
    ),
    (
        1309,
        "feed_drop=0.01,fence=0.003,queue_error=0.02,storage_error=0.02,budget=4",
        FEED_DROP_NEWS,
    ),
    (
        2637,
        "duplicate=0.02,feed_drop=0.005,fence=0.003,kill=0.004,queue_error=0.02,stall=0.003,"
        "budget=4",
        LATE_HOOK_ACTOR,
    ),
    # Issue 17 item 4 (gen_limits draws a limit on this seed): a woken waiter that a
    # higher-priority newcomer passed waited again, and every later wake reused its wait's
    # key and was deduplicated: two runs never admitted (limit_waiter).
    (
        83,
        "fail_after=0.005,fence=0.012,kill=0.008,lapse=0.012,lost_wake=0.002,pause=0.002,"
        "queue_error=0.02,stall=0.003,budget=4",
        LIMIT_WAKE_KEY,
    ),
    # Found by reverting each fix alone on a scratch tree and soaking seeds 0-199 with the
    # lapse, pause and crash faults (found_seeds.md, revert table): each fails with its fix
    # reverted, under its plan, and must pass with it.
    (1, "crash=0.004,feed_drop=0.01,fence=0.003,pause=0.008,budget=4", "bug 1: overlap"),
    (
        20,
        "feed_drop=0.0025,lapse=0.006,pause=0.002,queue_error=0.02,stall=0.003,"
        "storage_error=0.005,budget=8",
        "bug 3: exhausted_unrun",
    ),
    (
        30,
        "duplicate=0.005,fence=0.012,kill=0.008,lapse=0.006,lost_wake=0.002,stall=0.0015,budget=12",
        "bug 4: loop_held",
    ),
    (
        9,
        "duplicate=0.02,fail_after=0.01,fence=0.012,kill=0.002,stall=0.006,storage_error=0.01,"
        "budget=4",
        "bug 6: HookConflictError with the run's own received hook",
    ),
    (
        7,
        "duplicate=0.01,fail_after=0.02,feed_drop=0.005,lapse=0.006,budget=20",
        "F2: a second outcome",
    ),
    (
        147,
        "crash=0.002,feed_drop=0.01,lapse=0.012,stall=0.0015,storage_error=0.005,budget=8",
        "F3: stale_body (inline starts committed after their process stalled past the lease)",
    ),
    (
        0,
        "crash=0.001,fail_after=0.02,lapse=0.006,lost_wake=0.004,queue_error=0.02,stall=0.0015,"
        "budget=4",
        "F3 (writer): lease_ignored",
    ),
    (
        67,
        "crash=0.004,duplicate=0.005,fail_after=0.01,kill=0.002,lost_wake=0.004,pause=0.002,"
        "queue_error=0.02,stall=0.0015,storage_error=0.01,budget=8",
        "bug 2: cancelled_body",
    ),
    (
        122,
        "fail_after=0.02,feed_drop=0.0025,fence=0.012,kill=0.004,queue_error=0.005,stall=0.003,"
        "storage_error=0.02,budget=20",
        "StaleStepStart: attempt 2 after 3",
    ),
    (
        165,
        "fail_after=0.02,queue_error=0.01,stall=0.003,budget=4",
        "unknown outcomes: exhausted_unrun",
    ),
    (
        58,
        "crash=0.002,fail_after=0.01,lapse=0.006,pause=0.008,queue_error=0.005,stall=0.006,"
        "budget=12",
        STEP_START_AFTER_LAPSE,
    ),
    (
        271,
        "duplicate=0.005,fail_after=0.01,feed_drop=0.01,fence=0.006,queue_error=0.01,stall=0.006,"
        "storage_error=0.01,budget=8",
        STEP_START_AFTER_LAPSE,
    ),
    # Found by reverting each fix alone on main 3b4f65d (found_seeds.md, revert table) where
    # no pinned seed failed with it reverted any more.
    (
        94,
        "duplicate=0.005,fail_after=0.01,feed_drop=0.005,fence=0.006,lapse=0.012,"
        "queue_error=0.005,budget=20",
        "unknown outcomes (step handler): exhausted_unrun",
    ),
    (
        37,
        "fail_after=0.02,feed_drop=0.01,kill=0.008,lapse=0.012,pause=0.004,budget=8",
        "unknown outcomes settle in place (writer): false StepAttemptsExhausted",
    ),
    (
        136,
        "duplicate=0.02,fail_after=0.02,fence=0.006,kill=0.002,lost_wake=0.008,pause=0.002,"
        "queue_error=0.01,stall=0.0015,budget=12",
        "StaleStepStart: attempt 1 after 2",
    ),
    (
        208,
        "fail_after=0.01,queue_error=0.005,stall=0.0015,storage_error=0.02,budget=12",
        "the writer checks the lease before writing an unknown outcome again: lease_ignored",
    ),
    (
        823,
        "duplicate=0.02,kill=0.002,queue_error=0.02,stall=0.006,budget=20",
        "the re-send key carries the delivery's count: never_ended (found in seeds 200-999)",
    ),
]

# Seeds that found a run-ahead bug (issue 15 item 1), replayed at WORKFLOW_RUN_AHEAD_DEPTH
# 10 (``--run-ahead 10``: a seed's depth is otherwise drawn, and may be 0).
PINNED_RUN_AHEAD: list[tuple[int, str, str]] = [
    (
        1,
        "crash=0.004,feed_drop=0.01,fence=0.003,pause=0.008,budget=4",
        "a max_retries=0 start written ahead counts as running until its body starts: "
        "exhausted_unrun; a drain that started its body passes again: never_ended",
    ),
    (
        3,
        "feed_drop=0.005,fence=0.003,pause=0.004,stall=0.006,storage_error=0.005,budget=8",
        "a body's own write queues behind the groups written ahead: a step_retrying "
        "before its creation (log)",
    ),
    (
        4,
        "crash=0.004,duplicate=0.02,kill=0.008,lapse=0.006,queue_error=0.02,stall=0.0015,budget=8",
        "a drain that started a max_retries=0 body passes again, never finishes: never_ended",
    ),
]


# Seeds found with issue 17's generators on (session 9, docs/plans/s9-sim.md), replayed
# under their plan with the CLI flags they failed with (all generators unless named).
CHILD_VERDICT_LOST = (
    "simulation: a child's last attempt lost its verdict with its lease (fence) and was "
    "failed as StepAttemptsExhausted by the rule; the parent's output is judged by the "
    "child's log"
)
STALE_FAMILY_WRITE = (
    "a child run's delivery told its lease lapsed wrote the child's outcome into its "
    "parent's log (after_terminal): lease_ignored"
)
# Issue 17's generators, as these seeds were found (before gen_schedules).
ISSUE17 = ("--generators", "attributes,children,timeouts,streams,hook_claims,limits")
WITH_SCHEDULES = (ISSUE17[0], ISSUE17[1] + ",schedules")
WITH_FENCES = (ISSUE17[0], ISSUE17[1] + ",schedules,stream_fences")
PINNED_GENERATORS: list[tuple[int, str, tuple[str, ...], str]] = [
    (
        35,
        "feed_drop=0.0025,fence=0.003,pause=0.004,storage_error=0.01,budget=12",
        ("--optimistic", "on", *ISSUE17),
        CHILD_VERDICT_LOST,
    ),
    (
        2123,
        "fail_after=0.02,feed_drop=0.01,fence=0.012,lost_wake=0.002,stall=0.0015,"
        "storage_error=0.02,budget=8",
        ("--generators", "children,streams"),
        CHILD_VERDICT_LOST + " (a max_retries=0 step's in-band outcome refused)",
    ),
    (
        110,
        "duplicate=0.005,fail_after=0.01,queue_error=0.01,stall=0.006,budget=8",
        ("--optimistic", "on", *ISSUE17),
        STALE_FAMILY_WRITE,
    ),
    (
        189,
        "crash=0.001,fail_after=0.02,feed_drop=0.0025,kill=0.004,lapse=0.012,lost_wake=0.008,"
        "pause=0.008,queue_error=0.01,stall=0.006,budget=12",
        ("--optimistic", "default", *ISSUE17),
        STALE_FAMILY_WRITE + " (told while it read the run's record)",
    ),
    (
        16,
        "crash=0.004,fail_after=0.02,kill=0.004,lapse=0.003,pause=0.004,queue_error=0.01,"
        "stall=0.006,budget=8",
        ("--optimistic", "default", *WITH_SCHEDULES),
        "schedules: a claimed run whose start message's send failed stayed pending for good,"
        " its schedule's firings held behind it: schedule_not_quiet",
    ),
    (
        30,
        "duplicate=0.005,fence=0.012,kill=0.008,lapse=0.006,lost_wake=0.002,stall=0.0015,budget=12",
        ("--optimistic", "default", *WITH_SCHEDULES),
        "simulation: a process spawned from a dying delivery inherited it; its firing loop's "
        "cancel was taken for that delivery's write: lease_ignored",
    ),
    (
        411,
        "duplicate=0.01,feed_drop=0.01,fence=0.003,stall=0.006,storage_error=0.01,budget=4",
        ("--optimistic", "on", *WITH_FENCES),
        "a parent's delivery told its lease lapsed repaired a child's lost outcome report "
        "into its log (ensure_open): lease_ignored",
    ),
    (
        318,
        "crash=0.001,fail_after=0.01,lapse=0.012,lost_wake=0.004,queue_error=0.02,"
        "storage_error=0.02,budget=20",
        ("--optimistic", "default", "--spec", "mixed"),  # every generator; the last --spec wins
        "a background max_retries=0 step's start write had an unknown outcome and the one "
        "read back failed too; the redelivery failed it as exhausted, never run: "
        "exhausted_unrun",
    ),
    (
        598,
        "fence=0.006,kill=0.004,lapse=0.003,lost_wake=0.002,queue_error=0.01,stall=0.003,"
        "storage_error=0.005,budget=8",
        ("--optimistic", "default", "--spec", "mixed"),
        "a parent's delivery stalled in a child's runs.create past its lease, then reported "
        "the child's outcome into its log (children.create, seed 411's fresh twin): "
        "lease_ignored",
    ),
]


def _cli(*args: str, hash_seed: str | None = None) -> subprocess.CompletedProcess[str]:
    """The simulation's CLI in a fresh interpreter (under ``hash_seed`` if given)."""
    env = None if hash_seed is None else {**os.environ, "PYTHONHASHSEED": hash_seed}
    return subprocess.run(
        [sys.executable, "-m", "treadle.testing.simulation", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
    )


# The CI seeds run in chunks, each simulated once in one subprocess by the xdist worker
# its group goes to: a module fixture ran all 200 on both workers (131 s each here).
CI_CHUNK = 50
_chunks: dict[int, dict[int, dict[str, Any]]] = {}


def _ci_result(seed: int) -> dict[str, Any]:
    chunk = seed // CI_CHUNK
    if chunk not in _chunks:
        first = max(CI_SEEDS[0], chunk * CI_CHUNK)
        seeds = [s for s in CI_SEEDS if s // CI_CHUNK == chunk]
        done = _cli("--seeds", str(len(seeds)), "--start", str(first), "--json", "--spec", "9")
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert len(lines) == len(seeds), done.stderr[-2000:]
        _chunks[chunk] = {line["seed"]: line for line in lines}
    return _chunks[chunk][seed]


def _seed_param(seed: int) -> Any:
    marks = [pytest.mark.xdist_group(f"simulation-{seed // CI_CHUNK}")]
    if seed in KNOWN_FAILING:
        marks.append(pytest.mark.xfail(reason=KNOWN_FAILING[seed], strict=False))
    return pytest.param(seed, marks=marks)


@pytest.mark.parametrize("seed", [_seed_param(s) for s in CI_SEEDS])
def test_seed_holds_every_invariant(seed: int) -> None:
    """Every invariant holds for this seed (faults drawn from the seed; spec 9 runs, as
    these seeds were found: spec 8 seeds run in test_simulation_spec8.py)."""
    got = _ci_result(seed)
    assert got["ok"], "\n".join([*got["violations"], got["replay"]])


@pytest.mark.parametrize(
    ("seed", "plan"),
    [pytest.param(seed, plan, id=f"{seed}: {bug}") for seed, plan, bug in PINNED],
)
def test_pinned_seed_holds_every_invariant_under_its_plan(seed: int, plan: str) -> None:
    """A seed that once showed the bug in its id holds every invariant under its plan."""
    # Found on spec 9 runs, before issue 17's generators existed: replayed as pinned.
    done = _cli("--seed", str(seed), "--plan", plan, "--spec", "9", "--no-features")
    assert done.returncode == 0, (
        "\n".join(
            line for line in done.stdout.splitlines() if line.startswith(("VIOLATION", "replay"))
        )
        or done.stderr[-2000:]
    )


@pytest.mark.parametrize(
    ("seed", "plan"),
    [pytest.param(seed, plan, id=f"{seed}: {bug}") for seed, plan, bug in PINNED_RUN_AHEAD],
)
def test_pinned_run_ahead_seed_holds_every_invariant_under_its_plan(seed: int, plan: str) -> None:
    """A seed that once showed the run-ahead bug in its id holds every invariant."""
    done = _cli("--seed", str(seed), "--plan", plan, "--spec", "9", "--run-ahead", "10")
    assert done.returncode == 0, (
        "\n".join(
            line for line in done.stdout.splitlines() if line.startswith(("VIOLATION", "replay"))
        )
        or done.stderr[-2000:]
    )


@pytest.mark.parametrize(
    ("seed", "plan", "flags"),
    [
        pytest.param(seed, plan, flags, id=f"{seed}: {bug}")
        for seed, plan, flags, bug in PINNED_GENERATORS
    ],
)
def test_pinned_generator_seed_holds_every_invariant_under_its_plan(
    seed: int, plan: str, flags: tuple[str, ...]
) -> None:
    """A seed that once showed the bug in its id, with issue 17's generators on."""
    done = _cli("--seed", str(seed), "--plan", plan, "--spec", "9", *flags)
    assert done.returncode == 0, (
        "\n".join(
            line for line in done.stdout.splitlines() if line.startswith(("VIOLATION", "replay"))
        )
        or done.stderr[-2000:]
    )


def test_a_seed_replays_exactly_in_another_process() -> None:
    """Determinism across processes and hash seeds: the verbose replay of a faulty seed is
    byte-identical under two PYTHONHASHSEED values (the engine never iterates a set of
    strings in hash order; pytest's own process replays what the CLI prints)."""
    args = (
        "--seed",
        "7",
        "--plan",
        "storage_error=0.02,kill=0.01,stall=0.01,duplicate=0.02,pause=0.01,lapse=0.01,"
        "kill_owner=0.02,budget=8",
        "--spec",
        "mixed",  # runs 0 and 2 are spec 8: their several writers replay exactly too
    )
    first, second = _cli(*args, hash_seed="1"), _cli(*args, hash_seed="4242")
    assert "fault " in first.stdout and "body " in first.stdout
    # The header line carries the real seconds taken; everything after it is the replay.
    assert first.stdout.split("\n", 1)[1] == second.stdout.split("\n", 1)[1]


def test_same_seed_replays_the_same_trace() -> None:
    """Determinism in one process: a seed with faults gives the same trace and verdict twice."""
    config = Config(
        runs=2,
        plan=FaultPlan.parse("storage_error=0.02,kill=0.01,stall=0.01,duplicate=0.02,budget=8"),
    )
    first, second = simulate(7, config), simulate(7, config)
    assert first.trace and first.trace == second.trace
    assert [str(v) for v in first.violations] == [str(v) for v in second.violations]
    assert first.sim_seconds == second.sim_seconds


def test_another_seed_draws_another_schedule() -> None:
    """The seed matters: two seeds give different traces (the PRNG is really used)."""
    assert simulate(7, Config(runs=2)).trace != simulate(8, Config(runs=2)).trace


def test_planted_defect_in_the_wait_rule_is_reported_with_its_seed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A wrong ``decisions.due_waits`` (no sleep ever comes due) fails as never_ended."""
    monkeypatch.setattr(decisions, "due_waits", lambda state, *, now_ms, woken: [])
    config = Config(runs=1, plan=FaultPlan.none(), shape=Shape(hooks=False, actors=False))
    seed = _seed_with(config, lambda r: any(op["k"] == "sleep" for op in r.programs[0].ops))
    report = simulate(seed, config)
    assert {v.kind for v in report.violations} >= {"never_ended"}
    assert f"--seed {seed}" in report.replay_command()


def test_planted_forgetful_near_due_keys_are_reported_as_resent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process that forgets the near-due keys it sent (``RecentKeys`` remembering nothing:
    the waste CI once caught, one key sent by ``arm`` and again by ``arm_near_due``) is a
    ``near_due_resent``; seed 1 shows it at the default plan, and passes with the rule."""
    assert "near_due_resent" not in {v.kind for v in simulate(1, Config()).violations}
    monkeypatch.setattr(runtime.RecentKeys, "seen", lambda self, key: False)
    monkeypatch.setattr(runtime.RecentKeys, "first_time", lambda self, key: True)
    assert "near_due_resent" in {v.kind for v in simulate(1, Config()).violations}


def test_planted_double_execution_is_reported_as_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step body run twice at once (the defect bug 1 is an instance of) is an overlap."""
    real = functions.StepFunction.run_body

    async def twice(self: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        first, _ = await asyncio.gather(real(self, args, kwargs), real(self, args, kwargs))
        return first

    monkeypatch.setattr(functions.StepFunction, "run_body", twice)
    config = Config(runs=1, plan=FaultPlan.none(), shape=Shape(hooks=False, actors=False))
    report = simulate(_seed_with(config, lambda r: bool(r.programs[0].ops)), config)
    assert "overlap" in {v.kind for v in report.violations}


def test_a_held_loop_is_reported_not_hung() -> None:
    """A callback that never yields trips the watchdog: LoopHeld, within seconds."""

    async def spin() -> None:
        await asyncio.sleep(1)
        while True:
            pass

    t0 = time.monotonic()
    with pytest.raises(loop.LoopHeld):
        loop.run(spin, rng=random.Random(1), watchdog_seconds=1.0)
    assert time.monotonic() - t0 < 10


def test_a_spin_of_instant_awaits_is_reported() -> None:
    """Awaiting only things that finish at once, forever, is a livelock at frozen time."""

    async def spin() -> None:
        while True:  # noqa: ASYNC110 - the livelock under test
            await asyncio.sleep(0)

    with pytest.raises(loop.LoopHeld, match="without time moving"):
        loop.run(spin, rng=random.Random(1))


def test_virtual_time_costs_no_real_time() -> None:
    """A day of sleeps passes in well under a second, in the order of their deadlines."""

    async def main() -> tuple[float, list[int]]:
        order: list[int] = []

        async def nap(i: int) -> None:
            await asyncio.sleep(3600.0 * i)
            order.append(i)

        await asyncio.gather(*(nap(i) for i in (3, 1, 24, 2)))
        return asyncio.get_running_loop().time(), order

    t0 = time.monotonic()
    at, order = loop.run(main, rng=random.Random(3))
    assert at == 24 * 3600.0 and order == [1, 2, 3, 24]
    assert time.monotonic() - t0 < 1.0


def test_fault_plans_round_trip_through_the_replay_command() -> None:
    plan = FaultPlan.parse("kill=0.01,stall=0.004,budget=6")
    assert FaultPlan.parse(str(plan)) == plan
    assert str(FaultPlan.parse("none")) == "none"


def test_shrinking_keeps_the_failure_and_does_not_grow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shrinking a planted never-ended failure keeps it, with no more runs or ops."""
    monkeypatch.setattr(decisions, "due_waits", lambda state, *, now_ms, woken: [])
    config = Config(runs=3, plan=FaultPlan.parse("storage_error=0.01,budget=4"))
    report = next(
        r
        for r in (simulate(seed, config) for seed in range(40))
        if "never_ended" in {v.kind for v in r.violations}
    )
    small = shrink(report, max_attempts=12, kinds={"never_ended"})
    assert "never_ended" in {v.kind for v in small.violations}
    assert small.programs[0].size() <= report.programs[0].size() or small.config != config
    assert small.config.runs <= config.runs and small.config.shape.max_ops <= config.shape.max_ops
    # Some of these seeds end as loop_held, abandoning the simulation inside its virtual
    # clock: the process's clock must be the system one again (later tests read it).
    assert clock.current() is clock.SYSTEM


def _seed_with(config: Config, want: Any) -> int:
    """The first seed whose generated programs satisfy ``want`` (programs only, no run)."""
    from treadle.testing.simulation import workload
    from treadle.testing.simulation.runner import Report

    for seed in range(200):
        rng = random.Random(f"{seed}/program")
        report = Report(seed, config.plan or FaultPlan.none(), config)
        report.programs = [
            workload.generate(rng, config.shape, prefix=f"r{i}.") for i in range(config.runs)
        ]
        if want(report):
            return seed
    raise AssertionError("no seed fits")


def test_planted_f3_revert_is_reported_as_stale_body(monkeypatch: pytest.MonkeyPatch) -> None:
    """F3 reverted (a delivery never hears its lease lapsed) is caught in this process: the
    timeline the CLI prints for seed 147 replays here (no hash seed is fixed) and a
    retryable body starts in a delivery already told its lease lapsed.

    Seed 147 was found by replaying seeds 0-199 under the pinned plan with
    ``DeliveryMeta.lost_lease`` patched to False as below, keeping those that report
    ``stale_body`` and pass with F3 in place (8, 76, 147, 151, 180, 183; the same under
    PYTHONHASHSEED 0, 1, 999); 147 is the one whose stale bodies are inline starts: p1
    stalls 20 s in a write at 0.0, its deliveries are told at 10.0 that their leases
    lapsed, and their ``step_started`` batches commit at 20.0 (with F3 no body starts).
    Seed 160, pinned before, stopped showing it after the writer began settling unknown
    outcomes in place and the step handler began reading the log on every delivery.
    Seed 147 stopped showing it once the workers beat (``treadle.world.liveness``: a
    stalled process's leases lapse at its 3 s liveness, not its 10 s lease, and the
    schedule moved); of the candidates above 8 and 76 still did, under the same plan, and
    8 was used until run-ahead and optimistic starts (drawn per seed) moved the schedules
    again; a search of seeds 0-199 then found 6, 7, 30 and 36, and 6 is used. It runs
    without issue 17's generators (``Config.generators``): their ops moved its schedule."""
    from treadle.world import messages

    _, plan = next((s, p) for s, p, bug in PINNED if bug.startswith("F3: stale_body"))
    seed = 6
    config = Config(plan=FaultPlan.parse(plan), generators=(), warm=0)
    assert simulate(seed, config).ok
    monkeypatch.setattr(messages.DeliveryMeta, "lost_lease", lambda self: False)
    report = simulate(seed, config)
    assert "stale_body" in {v.kind for v in report.violations}, report.violations


def test_pause_and_crash_strike_between_world_calls() -> None:
    """The ``pause`` and ``crash`` faults fire at instants of their own, not at a World call,
    and each is counted against the plan's budget."""
    config = Config(plan=FaultPlan.parse("pause=0.02,crash=0.01,budget=6"))
    report = simulate(3, config)
    points = {line.split()[3] for line in report.trace if line.startswith("fault ")}
    assert points == {"process"}
    assert report.faults["pause"] >= 1 and report.faults["crash"] >= 1
    assert sum(report.faults.values()) <= 6


def test_planted_overadmission_is_reported_as_a_limit_violation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A limit store that admits every claim (issue 17 item 4) lets two runs of one key
    overlap: the limit invariants (``invariants_limits``) report it. Seed 3 draws a
    ``max=1`` limit with bodies that hold their slot for 0.3 s (``gen_limits.draw``)."""
    from treadle.testing.memory import limits as memory_limits
    from treadle.testing.simulation import gen_limits
    from treadle.world import limitrules

    plan = gen_limits.draw(3)
    assert plan is not None and plan.max == 1 and plan.hold > 0
    config = Config(plan=FaultPlan.none())
    assert simulate(3, config).ok

    async def admit_all(self: Any, claim: Any, *, now_ms: int) -> limitrules.Admission:
        return limitrules.Admission(held=True)

    monkeypatch.setattr(memory_limits.MemoryLimits, "acquire", admit_all)
    kinds = {v.kind for v in simulate(3, config).violations}
    assert {"limit_concurrency", "limit_step_concurrency"} <= kinds, kinds
