"""Generated timeouts (issue 17 item 5, docs/timeouts.md): steps with a start-to-close
timeout or a heartbeat timeout, and runs with a run timeout.

``add_timeouts`` gives a share of the spec 9 programs (from its own stream, so the
programs' own draws stay as they were) one or two ``tstep`` ops, and some of them a
run timeout::

    {"k": "tstep", "id": "t3", "v": "to", "dur": 8.0, "beat": false}
    {"k": "hold", "id": "t4"}       # a step that outlives any tight run timeout

A ``tstep`` runs the registered step of its variant ``v``: ``to`` (timeout 3 s,
max_retries 1), ``hb`` (heartbeat_timeout 2 s, max_retries 1) or ``both`` (timeout
10 s and heartbeat_timeout 2 s, max_retries 2). Its body sleeps ``dur`` virtual
seconds, beating every 0.5 s when ``beat``; it is *possible* (it ends inside its limits)
or not (``possible``), and the interpreter returns None whatever became of it, so the
program's expected output does not depend on it: ``invariants_timeouts`` judges it. A
program's ``run_timeout`` is ``TIGHT_SECONDS`` (a ``hold`` op first: the run must fail
with ``RunTimedOut``, never complete) or ``LOOSE_SECONDS`` (past the horizon: it never
fires, and the run ends as it would without it).

Every body start and end goes to the runner's ``Ledger`` like any step's; a body the
engine cancelled at its deadline or lapse is recorded ``timed_out``, and a ``hold`` cut
off by the simulation's end ``held`` (not ``cancelled``: that is for a dead process).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from typing import Any

from treadle import StepFailed, Workflows, clock, step_heartbeat, step_metadata
from treadle.sdk import functions
from treadle.testing.memory.consumer import current_delivery
from treadle.testing.simulation.loop import MONOTONIC_ORIGIN

KINDS = frozenset({"tstep", "hold"})
# The share of spec 9 programs given timeout ops, and of those given a run timeout.
TIMEOUT_SHARE = 0.3
RUN_TIMEOUT_SHARE = 0.35
TIGHT_SECONDS = 30.0
LOOSE_SECONDS = 86_400.0  # past any horizon: never fires
HOLD_SECONDS = 45.0  # past the tight deadline: its outcome comes after it
BEAT_EVERY = 0.5

# variant -> (timeout, heartbeat_timeout, max_retries)
VARIANTS: dict[str, tuple[float | None, float | None, int]] = {
    "to": (3.0, None, 1),
    "hb": (None, 2.0, 1),
    "both": (10.0, 2.0, 2),
}


def possible(op: dict[str, Any]) -> bool:
    """Whether a ``tstep``'s body ends inside its limits (fault-free)."""
    timeout, heartbeat, _ = VARIANTS[op["v"]]
    if timeout is not None and op["dur"] >= timeout:
        return False
    return not (heartbeat is not None and not op["beat"] and op["dur"] >= heartbeat)


def _draw(rng: random.Random, op_id: str) -> dict[str, Any]:
    variant = rng.choice(["to", "to", "hb", "both"])
    if variant == "to":
        dur, beat = rng.choice([0.5, 0.5, 8.0]), False
    elif variant == "hb":
        dur, beat = 6.0, rng.random() < 0.6
    else:
        dur, beat = rng.choice([1.0, 15.0]), True
    return {"k": "tstep", "id": op_id, "v": variant, "dur": dur, "beat": beat}


def add_timeouts(programs: list[Any], rng: random.Random, specs: list[int]) -> None:
    """Give some spec 9 programs timeout ops and a run timeout, from ``rng`` alone."""
    for program, spec in zip(programs, specs, strict=True):
        if spec < 9 or rng.random() >= TIMEOUT_SHARE:
            continue
        for n in range(rng.randint(1, 2)):
            at = rng.randint(0, len(program.ops))
            program.ops.insert(at, _draw(rng, f"t{n + 1}"))
        if rng.random() < RUN_TIMEOUT_SHARE:
            if rng.random() < 0.5:
                program.run_timeout = TIGHT_SECONDS
                program.ops.insert(0, {"k": "hold", "id": "t0"})
            else:
                program.run_timeout = LOOSE_SECONDS


def expected_override(program: Any) -> tuple[str, Any] | None:
    """A tight run timeout's expected end: failed with ``RunTimedOut``."""
    if getattr(program, "run_timeout", None) == TIGHT_SECONDS:
        return "failed", "RunTimedOut"
    return None


Steps = dict[str, functions.StepFunction[Any, Any]]


def build(app: Workflows, ledger: Any, clock_now: Callable[[], float]) -> Steps:
    """Register the timeout steps on ``app``; their bodies write to ``ledger``."""
    from treadle.testing.simulation import workload

    async def body(op: dict[str, Any]) -> str:
        md = step_metadata()
        entry = workload.BodyRun(
            md.run_id, md.step_id, op["id"], md.attempt, workload.current_process.get(),
            clock_now(),
        )  # fmt: skip
        leased = current_delivery.get()
        if leased is not None:
            entry.kind, entry.lease = leased.kind, leased.lost
            entry.message_id = leased.message_id
            entry.told_before_start = leased.lost.known_before(entry.started + MONOTONIC_ORIGIN)
        ledger.bodies.append(entry)
        timeout, heartbeat, _ = VARIANTS.get(op.get("v", ""), (None, None, 0))
        started = md.started_at.timestamp()  # the attempt's start, on the engine's clock
        last_beat = started
        try:
            if op["k"] == "hold":
                await asyncio.sleep(HOLD_SECONDS)
            else:
                left = float(op["dur"])
                while left > 0:
                    if op["beat"]:
                        step_heartbeat({"left": left})
                        last_beat = clock.now()
                    await asyncio.sleep(min(BEAT_EVERY, left))
                    left -= BEAT_EVERY
            entry.how = "returned"
            return f"ok:{op['id']}"
        except asyncio.CancelledError:
            now = clock.now()
            lapsed = (timeout is not None and now - started >= timeout - 1e-6) or (
                heartbeat is not None and now - last_beat >= heartbeat - 1e-6
            )
            # A hold outlives its run by design: cut off at the simulation's end, it is
            # "held", not a body the engine cancelled.
            held = op["k"] == "hold"
            entry.how = "held" if held else ("timed_out" if lapsed else "cancelled")
            raise
        finally:
            entry.ended = clock_now()

    steps: Steps = {}
    for variant, (timeout, heartbeat, retries) in VARIANTS.items():
        steps[variant] = app.step(
            name=f"sim_tstep_{variant}",
            max_retries=retries,
            timeout=timeout,
            heartbeat_timeout=heartbeat,
        )(body)
    steps["hold"] = app.step(name="sim_hold", max_retries=3)(body)
    return steps


async def call(steps: Steps, op: dict[str, Any]) -> None:
    """Run a ``tstep`` or ``hold`` op in the workflow; its fate is the invariants'."""
    with contextlib.suppress(StepFailed):
        await steps["hold" if op["k"] == "hold" else op["v"]](op)
