"""Generated workloads: workflow programs from a small grammar, run by real code.

A program is plain JSON (so it is the run's input and shows in a replay): a
list of operations the one registered workflow ``sim_program`` interprets::

    {"k": "step", "id": "s1", "r": 3, "fail": 1, "err": "retry", "dur": 0.5, "catch": true}
    {"k": "gather", "ops": [<step>, ...]}          # fan-outs up to past 64 steps
    {"k": "sleep", "s": 2.0}                       # short or several timer hops
    {"k": "hook", "token": "t1", "n": 0}           # wait for the payload sent to a token
    {"k": "race", "step": <step>, "sleep": 9000}   # a step against a sleep (result ignored)
    {"k": "race", "step": <step>, "sleep": 9000, "token": "t3"}  # ... against a hook
    {"k": "race_hook", "token": "t2", "n": 0, "sleep": 3.0}

A step body sleeps ``dur`` virtual seconds and fails its first ``fail``
runs (``err``: ``retry`` = RetryableError, ``plain`` = ValueError, ``fatal``
= FatalError); ``r`` picks the registered step with that ``max_retries`` (0, 1
or 3). Every body start and end is written to the ``Ledger`` (virtual time,
process, attempt) for the invariants. ``expected(program)`` is the output a
correct engine must produce without faults. Outside actors (hook resumes,
``cancel``, ``wake_up``) are drawn with the program. Used by the runner.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from dataclasses import dataclass, field
from typing import Any

from treadle import FatalError, Hook, RetryableError, StepFailed, Workflows, sleep, step_metadata
from treadle.testing.memory.consumer import current_delivery
from treadle.testing.simulation import gen_children, gen_hookclaims, gen_streams
from treadle.testing.simulation.loop import MONOTONIC_ORIGIN

Op = dict[str, Any]

# The name of the simulated process running the current task (set by processes.py).
current_process: contextvars.ContextVar[str] = contextvars.ContextVar(
    "treadle_sim_process", default="?"
)


class Payload(Hook):
    v: int


@dataclass
class BodyRun:
    """One start of a step body."""

    run_id: str
    step_id: str
    op_id: str
    attempt: int
    process: str
    started: float
    ended: float | None = None
    how: str = "running"  # returned | raised | cancelled | running
    # The delivery running it ("orchestrator": inline, "step": its own message), the
    # virtual time its lease lapsed if it did (filled in late, from the live event), and
    # whether that delivery had already been told so when this body started (F3).
    kind: str | None = None
    lease: Any = None
    told_before_start: bool = False
    # The queue message of that delivery (spec 8: an owned recovery is a redelivery of
    # the owner's message, so it has the first body's message id; seed 000).
    message_id: str | None = None

    def lease_lost_at(self) -> float | None:
        """Virtual time this body's delivery was told its lease lapsed, if it was."""
        at = getattr(self.lease, "at", None)
        return None if at is None else at - MONOTONIC_ORIGIN


@dataclass
class DeliveryRun:
    """One delivery of a queue message to a process's handler (spec 8 checks: was the
    owner's message delivered again while an earlier delivery of it still lived?)."""

    run_id: str
    message_id: str
    token: str
    process: str
    started: float
    settled: float | None = None


@dataclass
class Ledger:
    """Every step body start and end, in order; owned by the simulation. Also every
    delivery's start and settlement (recorded by ``processes.ProcessInterceptor``)."""

    bodies: list[BodyRun] = field(default_factory=list)
    deliveries: dict[str, DeliveryRun] = field(default_factory=dict)  # by lease token

    def of_run(self, run_id: str) -> list[BodyRun]:
        return [b for b in self.bodies if b.run_id == run_id]

    def deliveries_of(self, run_id: str) -> list[DeliveryRun]:
        return [d for d in self.deliveries.values() if d.run_id == run_id]


@dataclass
class Actor:
    """An outside action on a run at a virtual time after its start."""

    at: float
    kind: str  # resume | cancel | wake_up
    token: str | None = None
    n: int = 0


@dataclass
class Program:
    ops: list[Op]
    actors: list[Actor]
    run_timeout: float | None = None  # ``gen_timeouts``: the run's run timeout

    def size(self) -> int:
        return sum(len(o.get("ops", [])) or 1 for o in self.ops) + len(self.actors)


# -- generation ---------------------------------------------------------------------------


@dataclass
class Shape:
    """Bounds on what the generator draws (the shrinker lowers them)."""

    max_ops: int = 6
    max_gather: int = 6
    fanout: bool = True
    hooks: bool = True
    actors: bool = True
    long_sleeps: bool = True


def _step(rng: random.Random, sid: str, *, quick: bool = False) -> Op:
    r = rng.choice([0, 1, 3, 3])
    fail = 0
    err = "retry"
    roll = rng.random()
    if roll < 0.35:
        fail = rng.choice([1, 1, 2, 4])
        err = rng.choice(["retry", "retry", "plain", "fatal"])
    dur = 0.0 if quick else rng.choice([0.0, 0.0, 0.05, 0.5, 2.0, 7.0, 25.0])
    return {
        "k": "step",
        "id": sid,
        "r": r,
        "fail": fail,
        "err": err,
        "dur": dur,
        "catch": rng.random() < 0.8,
    }


def generate(rng: random.Random, shape: Shape | None = None, *, prefix: str = "") -> Program:
    """Draw one program and its outside actors (hook tokens start with ``prefix``)."""
    shape = shape or Shape()
    ops: list[Op] = []
    actors: list[Actor] = []
    counter = 0

    def sid() -> str:
        nonlocal counter
        counter += 1
        return f"s{counter}"

    tokens = 0
    for _ in range(rng.randint(1, max(1, shape.max_ops))):
        roll = rng.random()
        if roll < 0.35:
            ops.append(_step(rng, sid()))
        elif roll < 0.55:
            big = shape.fanout and rng.random() < 0.12
            n = rng.randint(65, 72) if big else rng.randint(2, max(2, shape.max_gather))
            ops.append({"k": "gather", "ops": [_step(rng, sid(), quick=big) for _ in range(n)]})
        elif roll < 0.70:
            hop = shape.long_sleeps and rng.random() < 0.3
            ops.append(
                {
                    "k": "sleep",
                    "s": rng.choice([150.0, 400.0]) if hop else rng.choice([0.5, 3.0, 20.0]),
                }
            )
        elif roll < 0.80:
            race: Op = {"k": "race", "step": _step(rng, sid()), "sleep": rng.choice([0.01, 9000.0])}
            if shape.hooks and race["sleep"] > 1000 and rng.random() < 0.5:
                # The step races a hook instead: its payload comes before, during or after.
                tokens += 1
                race["token"] = f"{prefix}t{tokens}"
                at = rng.choice([0.0, 1.0, 5.0, 40.0])
                actors.append(Actor(at=at, kind="resume", token=race["token"], n=0))
            ops.append(race)
        elif shape.hooks:
            tokens += 1
            token = f"{prefix}t{tokens}"
            repeat = rng.random() < 0.3
            for n in range(2 if repeat else 1):
                if rng.random() < 0.2:
                    ops.append({"k": "race_hook", "token": token, "n": n, "sleep": 9000.0})
                else:
                    ops.append({"k": "hook", "token": token, "n": n})
                # before it exists (0), while the run works, or well after
                actors.append(
                    Actor(
                        at=rng.choice([0.0, 1.0, 5.0, 40.0, 300.0]), kind="resume", token=token, n=n
                    )
                )
                if not repeat and rng.random() < 0.15:  # a duplicate resume, same payload
                    actors.append(
                        Actor(at=rng.choice([0.5, 60.0]), kind="resume", token=token, n=n)
                    )
    if shape.actors:
        if rng.random() < 0.2:
            actors.append(Actor(at=rng.choice([0.5, 10.0, 100.0]), kind="wake_up"))
        if rng.random() < 0.07:
            actors.append(Actor(at=rng.choice([0.2, 5.0, 50.0]), kind="cancel"))
    return Program(ops, actors)


def add_chains(programs: list[Program], rng: random.Random, specs: list[int]) -> None:
    """Give some spec 9 programs a run of 3 to 6 sequential inline steps (run-ahead's
    ground: each outcome and the next start go out in one write), drawn from ``rng``
    alone so the programs' own draws stay as they were."""
    for program, spec in zip(programs, specs, strict=True):
        if spec < 9 or rng.random() >= CHAIN_SHARE:
            continue
        at = rng.randint(0, len(program.ops))
        base = sum(len(o.get("ops", [])) or 1 for o in program.ops) + 1
        chain = []
        for i in range(rng.randint(3, 6)):
            step = _step(rng, f"c{base + i}")
            step["dur"] = rng.choice([0.0, 0.0, 0.05, 0.5])
            chain.append(step)
        program.ops[at:at] = chain


# The share of spec 9 programs given a sequential chain (``add_chains``).
CHAIN_SHARE = 0.6


# -- the expected outcome -------------------------------------------------------------------


def _step_result(op: Op) -> tuple[str, str | None]:
    """("ok", None) or ("failed", error_type) of a step op in a fault-free run."""
    if op["fail"] == 0:
        return "ok", None
    if op["err"] == "fatal":
        return "failed", "FatalError"
    if op["fail"] > op["r"]:
        return "failed", {"retry": "RetryableError", "plain": "ValueError"}[op["err"]]
    return "ok", None


def expected(program: Program) -> tuple[str, Any]:
    """(status, output or error type) a correct engine produces without faults or cancel."""
    from treadle.testing.simulation import gen_timeouts

    override = gen_timeouts.expected_override(program)
    if override is not None:
        return override
    out: list[Any] = []
    for op in program.ops:
        k = op["k"]
        if k == "step":
            kind, err = _step_result(op)
            if kind == "failed" and not op["catch"]:
                return "failed", "StepFailed"
            out.append(f"ok:{op['id']}" if kind == "ok" else f"failed:{err}")
        elif k == "gather":
            out.append(
                [
                    f"ok:{c['id']}"
                    if _step_result(c)[0] == "ok"
                    else f"failed:{_step_result(c)[1]}"
                    for c in op["ops"]
                ]
            )
        elif (
            k in ("sleep", "race", "race_hook", "attr") or k in gen_timeouts.KINDS
        ):  # attr: gen_attributes
            out.append(None)
        elif k == "hook":
            out.append(_payload(op["token"], op["n"]))
        elif k == "child":
            out.append(gen_children.expected(op))
        elif k in gen_hookclaims.KINDS:
            out.append(gen_hookclaims.expected_output(op))
    return "completed", out


def may_conflict_with_own_hook(program: Program) -> bool:
    """True when the run may fail with its own ``HookConflictError`` without any fault.

    A ``race_hook`` leaves its hook open when the sleep wins (the program never
    disposes it), and an open hook holds its token until its payload is recorded or
    the run ends (seed 003 "Hook conflicts", "Terminal hook disposal": only the
    drain's disposal keeps a later same-token registration from conflicting with
    the run's own hook). Its 9000 s sleep wins only when a ``wake_up`` ends it
    before the payload lands; a later hook on the same token then conflicts with
    the run's own open hook, which is the engine keeping the rule, not a bug.
    """
    if not any(a.kind == "wake_up" for a in program.actors):
        return False
    raced: set[str] = set()
    for op in program.ops:
        if op["k"] in ("hook", "race_hook") and op["token"] in raced:
            return True
        if op["k"] == "race_hook":
            raced.add(op["token"])
    return False


def outcomes_expected(program: Program) -> dict[str, str]:
    """Op id -> "completed" / "failed" of every step that is not part of a race."""
    found: dict[str, str] = {}
    for op in program.ops:
        for child in [op] if op["k"] == "step" else op.get("ops", []):
            found[child["id"]] = "completed" if _step_result(child)[0] == "ok" else "failed"
    return found


def _payload(token: str, n: int) -> int:
    return sum(map(ord, token)) * 10 + n


def payload_of(actor: Actor) -> dict[str, int]:
    assert actor.token is not None
    return {"v": _payload(actor.token, actor.n)}


# -- the real functions -----------------------------------------------------------------------


def build(app: Workflows, ledger: Ledger, clock_now: Any) -> None:
    """Register ``sim_program`` and its steps (max_retries 0, 1, 3) on ``app``."""
    from treadle.testing.simulation import (
        gen_attributes,  # its ops (it imports this module)
        gen_timeouts,
    )

    tsteps = gen_timeouts.build(app, ledger, clock_now)  # generated timeouts

    async def body(op: Op) -> str:
        md = step_metadata()
        # Fail by how often the body itself ran (not by attempt number: a start whose
        # write raised after committing burns an attempt without running the body; a
        # cancelled run never reached its verdict).
        ran = sum(
            1
            for b in ledger.bodies
            if b.run_id == md.run_id and b.step_id == md.step_id and b.how in ("raised", "returned")
        )
        entry = BodyRun(
            md.run_id, md.step_id, op["id"], md.attempt, current_process.get(), clock_now()
        )
        leased = current_delivery.get()
        if leased is not None:
            entry.kind, entry.lease = leased.kind, leased.lost
            entry.message_id = leased.message_id
            entry.told_before_start = leased.lost.known_before(entry.started + MONOTONIC_ORIGIN)
        ledger.bodies.append(entry)
        try:
            await gen_attributes.step_write(op)
            # issue 17 item 6: its stream chunks, naming which run of this attempt's body
            # wrote them (0: the first; a refused start's body may run it again).
            again = sum(
                1
                for b in ledger.bodies
                if (b.run_id, b.step_id, b.attempt) == (md.run_id, md.step_id, md.attempt)
            )
            await gen_streams.write(op, md.attempt, again - 1)
            if op["dur"]:
                await asyncio.sleep(op["dur"])
            if ran < op["fail"]:
                entry.how = "raised"
                if op["err"] == "fatal":
                    raise FatalError(f"{op['id']} fails for good")
                if op["err"] == "plain":
                    raise ValueError(f"{op['id']} attempt {md.attempt} fails")
                raise RetryableError(f"{op['id']} attempt {md.attempt} fails", retry_after=0.2)
            entry.how = "returned"
            return f"ok:{op['id']}"
        except asyncio.CancelledError:
            entry.how = "cancelled"
            raise
        finally:
            entry.ended = clock_now()

    steps = {r: app.step(name=f"sim_step_r{r}", max_retries=r)(body) for r in (0, 1, 3)}

    async def call(op: Op, catch: bool) -> Any:
        try:
            return await steps[op["r"]](op)
        except StepFailed as exc:
            if not catch:
                raise
            return f"failed:{exc.error_type}"

    run_child = gen_children.build(app, call)  # child workflows

    async def sim_program(ops: list[Op]) -> list[Any]:
        out: list[Any] = []
        for op in ops:
            k = op["k"]
            if k == "child":
                out.append(await run_child(op))
            elif k == "step":
                out.append(await call(op, op["catch"]))
            elif k == "gather":
                out.append(list(await asyncio.gather(*(call(c, True) for c in op["ops"]))))
            elif k == "sleep":
                await sleep(op["s"])
                out.append(None)
            elif k == "attr":
                gen_attributes.workflow_write(op)
                out.append(None)
            elif k == "hook":
                got = await Payload.wait(token=op["token"])
                out.append(None if got is None else got.v)
            elif k == "race":
                other = sleep(op["sleep"]) if "token" not in op else Payload.wait(token=op["token"])
                racers = [
                    asyncio.ensure_future(call(op["step"], True)),
                    asyncio.ensure_future(other),
                ]
                await asyncio.wait(racers, return_when=asyncio.FIRST_COMPLETED)
                out.append(None)
            elif k == "race_hook":
                hook = asyncio.ensure_future(Payload.wait(token=op["token"]))
                await asyncio.wait(
                    [hook, asyncio.ensure_future(sleep(op["sleep"]))],
                    return_when=asyncio.FIRST_COMPLETED,
                )
                out.append(None)
            elif k in gen_timeouts.KINDS:
                await gen_timeouts.call(tsteps, op)
                out.append(None)
            elif k in gen_hookclaims.KINDS:
                out.append(await gen_hookclaims.run_op(op))
        return out

    app.workflow(name="sim_program")(sim_program)
