"""Programs for spec 8 runs: the spec 9 grammar's mix plus the shapes seed 000 is about.

A spec 8 run's program is a ``workload.generate`` program (so spec 8 and spec 9
runs of one workflow are compared on the same grammar and the same expected
outputs) with one or two of seed 000's shapes added, each an inline step whose
body is still running when something wakes the run:

- ``hook``: the step races a hook whose payload is sent while the body runs
  (issue #2780: the wake must not run the body a second time);
- ``timer``: the step races a sleep shorter than the body (a wait comes due);
- ``cancel``: a long step, and the run is cancelled while it runs;
- ``wake``: a long ``max_retries=0`` step and a ``run.wake_up()`` while it runs
  (the at-most-once rule under ownership);
- ``retrying``: an inline step that fails once or twice with a retryable error
  (ownership ends at ``step_retrying``; the retries are queue-owned) racing a hook;
- ``fanout``: two or three long inline steps at once and a hook payload meanwhile.

Body lengths are drawn around the simulation's ownership lease (``LEASE_SECONDS``
virtual seconds, far below the 860 s default, so leases expire in a seed): some
bodies outlast it, the second residual risk of seed 000 ("steps longer than the
lease"). A shape placed first starts at once, so its wake is timed inside the body.

Step ids of these shapes are ``o<n>`` and tokens ``<prefix>o<n>`` (the base
program's are ``s<n>`` and ``<prefix>t<n>``). Used by the runner for spec 8 runs,
from their own PRNG stream, so a spec 9 run's program is the same in every mode.
"""

from __future__ import annotations

import random

from treadle.testing.simulation import workload
from treadle.testing.simulation.workload import Actor, Op, Program, Shape

# The simulation's WORKFLOW_INLINE_OWNERSHIP_LEASE_SECONDS (virtual seconds).
LEASE_SECONDS = 30.0

SHAPES = ("hook", "timer", "cancel", "wake", "retrying", "fanout")

# Body lengths: most inside the lease, some beyond it (45 s and 90 s against 30 s).
_LONG = (4.0, 12.0, 12.0, 25.0, 25.0, 45.0, 90.0)


def _inline_step(
    rng: random.Random, sid: str, *, r: int | None = None, dur: float | None = None
) -> Op:
    return {
        "k": "step",
        "id": sid,
        "r": rng.choice([0, 1, 3]) if r is None else r,
        "fail": 0,
        "err": "retry",
        "dur": rng.choice(_LONG) if dur is None else dur,
        "catch": True,
    }


def _mid(rng: random.Random, dur: float, first: bool) -> float:
    """When a wake lands: inside the body when the shape comes first, else anywhere."""
    if first:
        return round(dur * rng.choice([0.2, 0.5, 0.8]), 3)
    return rng.choice([1.0, 5.0, 20.0, 60.0])


def shapes_allowed(shape: Shape) -> list[str]:
    allowed = ["timer", "retrying"]
    if shape.hooks:
        allowed += ["hook", "hook", "fanout"]  # the #2780 shape, twice as likely
    if shape.actors:
        allowed += ["cancel", "wake"]
    return allowed


def _shape(
    rng: random.Random, kind: str, n: int, prefix: str, first: bool
) -> tuple[list[Op], list[Actor]]:
    sid = f"o{n}"
    if kind == "hook":
        step = _inline_step(rng, sid)
        token = f"{prefix}o{n}"
        race: Op = {"k": "race", "step": step, "sleep": 9000.0, "token": token}
        return [race], [Actor(at=_mid(rng, step["dur"], first), kind="resume", token=token)]
    if kind == "timer":
        step = _inline_step(rng, sid)
        return [{"k": "race", "step": step, "sleep": round(step["dur"] / 3, 3)}], []
    if kind == "cancel":
        step = _inline_step(rng, sid)
        return [step], [Actor(at=_mid(rng, step["dur"], first), kind="cancel")]
    if kind == "wake":
        step = _inline_step(rng, sid, r=0)
        return [step], [Actor(at=_mid(rng, step["dur"], first), kind="wake_up")]
    if kind == "retrying":
        step = _inline_step(rng, sid, r=rng.choice([1, 3]), dur=rng.choice([0.5, 4.0, 12.0]))
        step["fail"] = rng.choice([1, 2]) if step["r"] == 3 else 1
        token = f"{prefix}o{n}"
        race = {"k": "race", "step": step, "sleep": 9000.0, "token": token}
        at = _mid(rng, step["dur"], first) + rng.choice([0.0, step["dur"]])
        return [race], [Actor(at=at, kind="resume", token=token)]
    # fanout: long inline steps side by side, and a hook payload while they run
    steps = [_inline_step(rng, f"{sid}.{i}") for i in range(rng.randint(2, 3))]
    token = f"{prefix}o{n}"
    shortest = min(s["dur"] for s in steps)
    return (
        [{"k": "gather", "ops": steps}, {"k": "hook", "token": token, "n": 0}],
        [Actor(at=_mid(rng, shortest, first), kind="resume", token=token)],
    )


def generate(rng: random.Random, shape: Shape | None = None, *, prefix: str = "") -> Program:
    """A spec 8 run's program: a base program with one or two seed 000 shapes added."""
    shape = shape or Shape()
    base = workload.generate(rng, shape, prefix=prefix)
    ops, actors = list(base.ops), list(base.actors)
    allowed = shapes_allowed(shape)
    count = 1 + (rng.random() < 0.4 and shape.max_ops > 1)
    for n in range(1, count + 1):
        kind = rng.choice(allowed)
        first = n == 1 and rng.random() < 0.6
        added, more = _shape(rng, kind, n, prefix, first)
        at = 0 if first else rng.randint(0, len(ops))
        ops[at:at] = added
        actors += more
    return Program(ops, actors)


def shape_of(program: Program) -> str | None:
    """The seed 000 shape a program starts with (its wake timed inside the body), if any."""
    if not program.ops:
        return None
    op = program.ops[0]
    if op["k"] == "race" and op["step"]["id"].startswith("o"):
        if "token" in op:
            return "retrying" if op["step"]["fail"] else "hook"
        return "timer"
    if op["k"] == "gather" and op["ops"] and op["ops"][0]["id"].startswith("o"):
        return "fanout"
    if op["k"] == "step" and op["id"].startswith("o"):
        kinds = {a.kind for a in program.actors}
        return "wake" if op["r"] == 0 and "wake_up" in kinds else "cancel"
    return None


def hook_mid_step(program: Program, *, within: float = LEASE_SECONDS) -> bool:
    """The #2780 shape: the program starts with a step racing a hook whose payload is
    sent while the body runs, inside the ownership lease."""
    if shape_of(program) != "hook":
        return False
    op = program.ops[0]
    token, dur = op["token"], op["step"]["dur"]
    return any(
        a.kind == "resume" and a.token == token and 0 < a.at < min(dur, within)
        for a in program.actors
    )
