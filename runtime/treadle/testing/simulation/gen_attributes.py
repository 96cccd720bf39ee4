"""Attribute writes in generated programs, and their invariants (issue 17 item 2).

``add_attributes`` (called by the runner after ``add_chains``, from its own PRNG
stream, so every other draw of a seed stays what it was) gives some programs:

- workflow writes (spec 9 runs only; spec 8 refuses them, ``AttributesNeedSpec9``):
  ``{"k": "attr", "set": {"w1": 3, "w2": "x"}}`` ops placed among the others, one
  ``set_attributes()`` call each, the same key sometimes set twice (the last wins);
- step writes (both formats): a step op marked ``"attrs": true`` calls
  ``set_attributes({"s_<id>": "<id>"})`` at the top of its body, every time it runs.

``check`` holds every run to: its record's attributes equal the fold of its
``run_created`` attributes and its ``attr_set`` events in slot order; no ``attr_set``
before ``run_started``; a workflow ``attr_set`` (one carrying a position) written once
per position (a replay never writes it again); and a completed run that no actor
cancelled holds each workflow write's value (the last one per key), and, when no
fault touched the run, each completed step's own attribute.

Used by ``runner`` and ``workload`` (``workflow_write``, ``step_write``).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from treadle import set_attributes
from treadle.testing.simulation.invariants import RunOutcome, Violation
from treadle.testing.simulation.workload import Op, Program, outcomes_expected
from treadle.world import attributes, constants, events

# Programs given attribute writes.
SHARE = 0.4
VALUES: tuple[Any, ...] = ("gold", 3, True, None, 2.5, {"nested": [1, 2]}, "x" * 40)


def _step_ops(ops: list[Op]) -> list[Op]:
    out: list[Op] = []
    for op in ops:
        if op["k"] == "step":
            out.append(op)
        elif op["k"] == "gather":
            out += op["ops"]
        elif op["k"] == "race":
            out.append(op["step"])
    return out


def add_attributes(programs: list[Program], rng: random.Random, specs: list[int]) -> None:
    for program, spec in zip(programs, specs, strict=True):
        if rng.random() >= SHARE:
            continue
        if spec >= constants.SPEC_VERSION_SINGLE_ORCHESTRATOR:
            for n in range(rng.randint(1, 3)):
                keys = rng.sample(["w1", "w2", "w3"], rng.randint(1, 2))
                op = {"k": "attr", "set": {k: rng.choice(VALUES) for k in keys}, "n": n}
                program.ops.insert(rng.randint(0, len(program.ops)), op)
        for step in _step_ops(program.ops):
            if rng.random() < 0.3:
                step["attrs"] = True


def workflow_write(op: Op) -> None:
    """The ``attr`` op in ``sim_program``: one ``set_attributes()`` call."""
    set_attributes(op["set"])


async def step_write(op: Op) -> None:
    """At the top of a marked step's body; a failed write leaves the body running."""
    if op.get("attrs"):
        try:
            await set_attributes({f"s_{op['id']}": op["id"]})
        except Exception:  # counted by ``check`` only for runs no fault touched
            return


def check(o: RunOutcome) -> list[Violation]:
    rec = o.record
    if rec is None:
        return []
    rid = o.run_id
    out: list[Violation] = []
    created = next((e.event for e in o.log if isinstance(e.event, events.RunCreated)), None)
    seeded = created.attributes if created is not None else {}
    sets = [e for e in o.log if isinstance(e.event, events.AttrSet)]
    folded = attributes.fold(seeded, [(e.event.key, e.event.value) for e in sets])  # type: ignore[union-attr]
    if rec.attributes != folded:
        out.append(
            Violation("attributes", rid, f"record {rec.attributes!r}, log folds to {folded!r}")
        )
    started = next((e.slot for e in o.log if e.type == "run_started"), None)
    early = [e.slot for e in sets if started is None or e.slot < started]
    if early:
        out.append(Violation("attributes", rid, f"attr_set at slots {early} before run_started"))
    positions = Counter(e.event.position for e in sets if e.event.position is not None)  # type: ignore[union-attr]
    twice = sorted(p for p, n in positions.items() if n > 1)
    if twice:
        out.append(Violation("attributes", rid, f"workflow attr_set rewritten at {twice}"))
    if rec.status != "completed" or o.cancelled_by_actor:
        return out
    wanted: dict[str, Any] = {}
    for op in o.program.ops:
        if op["k"] == "attr":
            wanted.update(op["set"])
    if o.faults_on_run == 0:
        done = outcomes_expected(o.program)
        for step in _step_ops(o.program.ops):
            if step.get("attrs") and done.get(step["id"]) == "completed":
                wanted[f"s_{step['id']}"] = step["id"]
    missing = {k: v for k, v in wanted.items() if k not in rec.attributes or rec.attributes[k] != v}
    if missing:
        out.append(Violation("attributes", rid, f"completed without {missing!r}"))
    return out
