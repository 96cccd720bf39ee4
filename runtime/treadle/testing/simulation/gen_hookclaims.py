"""Generated hook force-claims (issue 17 item 8), and their invariants.

``add_claims`` gives a share of the seeds one pair of spec 9 runs sharing a token, from
its own PRNG stream (``{seed}/claims``, so the other draws stay as they were): the
victim program gets ``{"k": "claimable", "token": T}`` (``create_hook(T)`` and await
its payload), the claimer program ``{"k": "claim", "token": T}`` (``create_hook(T,
force=True)`` and await it). Each run has an outside actor (``act``) that resumes ``T``
whenever its own run holds it, until its run ends; both send the same payload.

Which way it goes depends on the schedule: the victim's hook is claimed while it waits
(its op gives ``"claimed"``), resumed first (the payload) or created after the claim (a
conflict, ``"conflict"``); the claimer always gets the payload. ``expected_output`` and
``normalize`` let ``workload.expected`` and the output check accept exactly these.

``check`` (over every run of the seed): a victim's hook raises ``HookForceClaimedError``
exactly once when, and only when, its log holds the forced ``hook_disposed``; a
claimer's ``claimed_from`` names the victim iff the victim's disposal names the claimer;
the token has one live owner: the claimer's creation is never before the victim's
disposal, and a victim that took the payload was not claimed.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from treadle import HookConflictError, HookForceClaimedError, create_hook, errors
from treadle.world import events

KINDS = frozenset({"claim", "claimable"})
SHARE = 0.35
ANY_VICTIM_OUTCOME = "claim:victim"  # what the expected output holds for a victim's op


def add_claims(programs: list[Any], rng: random.Random, specs: list[int]) -> None:
    """One victim and one claimer among the spec 9 programs, for a share of the seeds."""
    nine = [i for i, spec in enumerate(specs) if spec >= 9]
    if len(nine) < 2 or rng.random() >= SHARE:
        return
    victim, claimer = rng.sample(nine, 2)
    token = f"fc.{victim}.{claimer}"
    for index, kind in ((victim, "claimable"), (claimer, "claim")):
        ops = programs[index].ops
        ops.insert(rng.randint(0, len(ops)), {"k": kind, "token": token})


def payload(token: str) -> int:
    return sum(map(ord, token)) * 10


async def run_op(op: dict[str, Any]) -> Any:
    """The workflow side of a ``claim`` or ``claimable`` op (called by ``sim_program``)."""
    if op["k"] == "claim":
        got: Any = await create_hook(op["token"], force=True).payload()
        return got["v"]
    try:
        got = await create_hook(op["token"]).payload()
        return got["v"]
    except HookForceClaimedError:
        return "claimed"
    except HookConflictError:
        return "conflict"


def expected_output(op: dict[str, Any]) -> Any:
    return payload(op["token"]) if op["k"] == "claim" else ANY_VICTIM_OUTCOME


def normalize(program: Any, got: Any) -> Any:
    """The run's output with each victim op's outcome (payload, claimed, conflict) as
    ``ANY_VICTIM_OUTCOME``; anything else is left to fail the comparison."""
    if not isinstance(got, list) or len(got) != len(program.ops):
        return got
    out = list(got)
    for i, op in enumerate(program.ops):
        if op["k"] == "claimable" and out[i] in (payload(op["token"]), "claimed", "conflict"):
            out[i] = ANY_VICTIM_OUTCOME
    return out


def tokens_of(program: Any) -> list[str]:
    return [op["token"] for op in program.ops if op["k"] in KINDS]


async def act(sim: Any, run: Any, token: str) -> None:
    """Resume ``token`` whenever ``run`` holds it, until ``run`` ends (virtual time)."""
    rng = random.Random(f"{sim.seed}/claims/{token}/{run.run_id}")
    world = await sim.app.world()
    while run.run_id not in sim.ended:
        await asyncio.sleep(rng.choice([0.5, 2.0, 10.0, 40.0]))
        try:
            holder = await world.hooks.get_by_token(token)
            if holder.run_id != run.run_id:
                continue
            await sim.app.resume_hook(token, {"v": payload(token)})
            return
        except (errors.HookNotFound, errors.RunExpired):
            continue
        except errors.TreadleError:
            continue  # an injected World fault: try again later


def check(outcomes: list[Any]) -> list[Any]:
    """The force-claim invariants over one seed's runs (``runner.simulate``)."""
    from treadle.testing.simulation.invariants import Violation

    out: list[Violation] = []
    by_token: dict[str, dict[str, Any]] = {}
    for o in outcomes:
        for op in o.program.ops:
            if op["k"] in KINDS:
                by_token.setdefault(op["token"], {})[op["k"]] = o
    for token, pair in sorted(by_token.items()):
        victim, claimer = pair.get("claimable"), pair.get("claim")
        if victim is None or claimer is None:
            continue
        hook_ids = {
            e.event.correlation_id
            for e in victim.log
            if isinstance(e.event, events.HookCreated) and e.event.token.endswith(token)
        }
        forced: list[tuple[Any, events.HookDisposed]] = [
            (e, e.event)
            for e in victim.log
            if isinstance(e.event, events.HookDisposed) and e.event.force_claimed_by
        ]
        created: list[tuple[Any, events.HookCreated]] = [
            (e, e.event)
            for e in claimer.log
            if isinstance(e.event, events.HookCreated) and e.event.token.endswith(token)
        ]
        if len(forced) > 1:
            out.append(Violation("claim", victim.run_id, f"{len(forced)} forced disposals"))
        names_victim = any(c.claimed_from == victim.run_id for _, c in created)
        names_claimer = any(f.force_claimed_by == claimer.run_id for _, f in forced)
        if names_victim != names_claimer:
            out.append(
                Violation(
                    "claim",
                    claimer.run_id,
                    f"claimed_from names the victim: {names_victim}; the victim's disposal "
                    f"names the claimer: {names_claimer}",
                )
            )
        for logged, _ in forced:
            taken = [e for e, c in created if c.claimed_from == victim.run_id]
            if taken and taken[0].created_at < logged.created_at:
                out.append(Violation("claim", claimer.run_id, "claimed before the disposal"))
        received = any(
            isinstance(e.event, events.HookReceived) and e.event.correlation_id in hook_ids
            for e in victim.log
        )
        if forced and received:
            out.append(Violation("claim", victim.run_id, "a claimed hook took a payload"))
        out += _victim_raised_once(victim, token, bool(forced))
    return out


def _victim_raised_once(victim: Any, token: str, forced: bool) -> list[Any]:
    """The victim's op gave "claimed" exactly when its hook was force-claimed."""
    from treadle import serde
    from treadle.testing.simulation.invariants import Violation

    rec = victim.record
    if rec is None or rec.status != "completed" or victim.tainted or victim.cancelled_by_actor:
        return []
    got = serde.decode(rec.output)
    if not isinstance(got, list):
        return []
    index = next(i for i, op in enumerate(victim.program.ops) if op.get("token") == token)
    if index >= len(got):
        return []
    if (got[index] == "claimed") != forced:
        return [
            Violation(
                "claim",
                victim.run_id,
                f"the victim's op gave {got[index]!r}; its log has a forced disposal: {forced}",
            )
        ]
    return []
