"""Generated child workflows (issue 17 item 1, docs/children.md).

A program op ``{"k": "child", "id": "k1", "body": [<step>, ...], "fail": bool,
"mode": "await" | "handle" | "forget", "policy": "cancel" | "abandon", "sleep": s}``
starts a child run of ``sim_child`` (its steps, each caught; ``fail``: it raises at the
end) and, by ``mode``: awaits it (``await child(...)``), starts it and awaits its
handle after ``sleep`` virtual seconds (``await app.start(...)``, ``handle.result()``),
or starts it and never awaits it (the close policy decides its fate when the parent
ends first). Drawn from a stream of its own (``add_children``), so the programs' other
draws stay as pinned. ``invariants_children`` checks what the World ends with.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

from treadle import ChildWorkflowFailed, Workflows, sleep
from treadle.sdk.functions import WorkflowFunction

Op = dict[str, Any]

# The share of spec 9 programs given one or two child ops.
CHILD_SHARE = 0.3
CHILD_WORKFLOW = "sim_child"


def add_children(programs: list[Any], rng: random.Random, specs: list[int]) -> None:
    """Insert child ops into some spec 9 programs (``workload.Program``)."""
    from treadle.testing.simulation.workload import _step

    for program, spec in zip(programs, specs, strict=True):
        if spec < 9 or rng.random() >= CHILD_SHARE:
            continue
        for n in range(rng.randint(1, 2)):
            cid = f"k{n + 1}"
            body = []
            for j in range(rng.randint(1, 3)):
                step = _step(rng, f"{cid}s{j + 1}")
                step["dur"] = rng.choice([0.0, 0.05, 0.5, 3.0])
                step["catch"] = True
                body.append(step)
            op: Op = {
                "k": "child",
                "id": cid,
                "body": body,
                "fail": rng.random() < 0.25,
                "mode": rng.choice(["await", "await", "handle", "forget"]),
                "policy": rng.choice(["cancel", "cancel", "abandon"]),
                "sleep": rng.choice([0.0, 0.0, 5.0]),
            }
            at = rng.randint(0, len(program.ops))
            program.ops[at:at] = [op]


def settle_seconds(programs: list[Any]) -> float:
    """Extra virtual seconds before the cut when some program has children: what the
    last parent's children need to end and report (``invariants_children``)."""
    return 60.0 if any(op["k"] == "child" for p in programs for op in p.ops) else 0.0


def expected(op: Op) -> Any:
    """What the parent's program records for a child op in a fault-free run."""
    from treadle.testing.simulation.workload import _step_result

    if op["mode"] == "forget":
        return None
    if op["fail"]:
        return "child_failed:ValueError"
    out = []
    for step in op["body"]:
        kind, err = _step_result(step)
        out.append(f"ok:{step['id']}" if kind == "ok" else f"failed:{err}")
    return out


def build(
    app: Workflows, call: Callable[[Op, bool], Awaitable[Any]]
) -> Callable[[Op], Awaitable[Any]]:
    """Register ``sim_child`` on ``app``; returns the interpreter of a child op."""

    async def sim_child(body: list[Op], fail: bool) -> list[Any]:
        out = [await call(step, True) for step in body]
        if fail:
            raise ValueError("the child fails at its end")
        return out

    child: WorkflowFunction[..., Any] = app.workflow(name=CHILD_WORKFLOW)(sim_child)

    async def run(op: Op) -> Any:
        bound = child.options(on_parent_close=op["policy"])
        try:
            if op["mode"] == "await":
                return await bound(op["body"], op["fail"])
            handle: Any = await app.start(bound, op["body"], op["fail"])
            if op["mode"] == "forget":
                return None
            if op["sleep"]:
                await sleep(op["sleep"])
            return await handle.result()
        except ChildWorkflowFailed as exc:
            return f"child_failed:{exc.error_type}"

    return run
