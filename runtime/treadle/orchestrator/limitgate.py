"""Concurrency and rate limits at the edges of a delivery (``docs/limits.md``).

A limited run takes its slot when it is started (``enter``, from ``start_run``): held,
its start message goes out (delayed to its rate reservation); waiting, nothing is sent
and the waiter's row keeps the start message. Every orchestrator delivery of a limited
run not yet admitted passes ``gate_run`` (so no wake, re-send or duplicate start runs a
waiting run), and a delivery that leaves the run ended releases its slot (``after_run``).
A limited step runs only from its own message (``StepCall.background``): ``gate_step``
before its attempt starts, ``release_step`` after its outcome. A release returns the
waiters now admissible; their stored messages are sent at once (``send_wakes``), under a
key per wait, so a second wake for one wait is deduplicated. The worker's ``sweeper``
sends the wakes a crash lost, every ``TREADLE_LIMIT_SWEEP_SECONDS``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from treadle import clock, errors
from treadle.limitview import store
from treadle.orchestrator.runtime import Runtime
from treadle.sdk import functions, limiting
from treadle.world import contract, limitrules, messages

log = logging.getLogger("treadle.orchestrator.limits")


def require_store(world: contract.World, where: str) -> contract.LimitStore:
    found = store(world)
    if found is None:
        raise errors.WorldContractError(
            f"{where} declares a concurrency or rate limit, and the World "
            f"{type(world).__name__} keeps no limits (world.limits)"
        )
    return found


def _decl(fn: Any) -> limiting.Limits:
    declared = getattr(fn, "limits", None)
    return declared if isinstance(declared, limiting.Limits) else limiting.Limits()


def keys_for(
    decl: limiting.Limits, args: Sequence[Any], kwargs: dict[str, Any], where: str
) -> tuple[str | None, str | None]:
    """The (concurrency, rate) keys of these arguments; ``LimitKeyError`` naming ``where``."""
    ckey = rkey = None
    if decl.concurrency is not None:
        ckey = limiting.compute_key(
            decl.concurrency.key, args, kwargs, where=where, limit="concurrency"
        )
    if decl.rate is not None:
        rkey = limiting.compute_key(decl.rate.key, args, kwargs, where=where, limit="rate")
    return ckey, rkey


def _stored_keys(decl: limiting.Limits, data: Any, where: str) -> tuple[str | None, str | None]:
    args, kwargs = functions.decode_arguments(data, where)
    return keys_for(decl, args, kwargs, where)


async def _admit(
    limits: contract.LimitStore,
    decl: limiting.Limits,
    keys: tuple[str | None, str | None],
    *,
    scope: str,
    holder: str,
    run_id: str,
    kind: limitrules.HolderKind,
    priority: int,
    wake: messages.OrchestratorMessage | messages.StepMessage,
) -> float | None:
    """None: waiting (recorded); else the seconds until the holder may start (0: now)."""
    ckey, rkey = keys
    if decl.concurrency is not None and ckey is not None:
        claim = limitrules.Claim(
            scope, ckey, decl.concurrency.max, holder, run_id, kind, priority,
            wake.model_dump_json(),
        )  # fmt: skip
        admission = await limits.acquire(claim, now_ms=clock.now_ms())
        if not admission.held:
            log.info(
                "run %s: %s waits on concurrency %s key %r (position %d)",
                run_id, holder, scope, ckey, admission.position,
            )  # fmt: skip
            return None
    if decl.rate is not None and rkey is not None:
        rate = decl.rate
        rclaim = limitrules.RateClaim(
            scope, rkey, holder, run_id, kind, rate.interval_ms, rate.burst
        )
        now = clock.now_ms()
        at = await limits.reserve(rclaim, now_ms=now)
        return max(at - now, 0) / 1000
    return 0.0


# -- workflows -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LimitEntry:
    """A limited workflow's admission at its start: its keys and the run's priority."""

    workflow: functions.WorkflowFunction[Any, Any]
    keys: tuple[str | None, str | None]
    priority: int


def entry(
    wf: functions.WorkflowFunction[Any, Any] | None,
    name: str,
    data: Any,
    priority: int | None,
    keys: tuple[str | None, str | None] | None,
) -> LimitEntry | None:
    """A start's ``LimitEntry`` (None: its workflow has no limit): the keys given, else
    from the stored input (``start_encoded``); ``LimitKeyError`` before anything is
    recorded, a bad ``priority`` a ``ValueError``."""
    if priority is not None:
        limiting.check_priority(f"workflow {name}", priority)
    if wf is None or not wf.limits.any:
        return None
    if keys is None:
        keys = _stored_keys(wf.limits, data, f"workflow {name}")
    return LimitEntry(wf, keys, wf.priority if priority is None else priority)


async def enter(
    world: contract.World,
    wf: functions.WorkflowFunction[Any, Any],
    keys: tuple[str | None, str | None],
    run_id: str,
    priority: int,
    start: messages.OrchestratorMessage,
) -> float | None:
    """A new run's admission at its start: None (waiting: send nothing), else the delay of
    its start message."""
    limits = require_store(world, f"workflow {wf.name}")
    return await _admit(
        limits, wf.limits, keys, scope=limitrules.workflow_scope(wf.name), holder=run_id,
        run_id=run_id, kind="workflow", priority=priority, wake=start,
    )  # fmt: skip


def limited_workflows(rt: Runtime) -> bool:
    return any(_decl(wf).any for wf in rt.workflows.values())


async def gate_run(
    rt: Runtime, message: messages.OrchestratorMessage
) -> tuple[bool, messages.HandlerResult | None]:
    """(limited, answer): answer None lets the delivery run; else the run waits (``Ack``:
    its waiter row holds its wake) or its rate slot is later (``Redeliver``)."""
    limits = store(rt.world)
    if limits is None or rt.limit_free.seen(message.run_id):
        return False, None
    if rt.limit_admitted.seen(message.run_id):
        return True, None
    hint = message.run_input.workflow_name if message.run_input is not None else None
    if hint is not None and not _decl(rt.workflows.get(hint)).any:
        return False, None  # a start's stamp names the workflow: no read needed
    try:
        run = await rt.world.runs.get(message.run_id)
    except errors.RunNotFound:
        return False, None  # the delivery says so
    wf = rt.workflows.get(run.workflow_name)
    decl = _decl(wf)
    if wf is None or not decl.any:
        rt.limit_free.mark(message.run_id)
        return False, None
    if run.status != "pending":
        rt.limit_admitted.mark(message.run_id)  # started: admitted once, for its life
        return True, None
    where = f"workflow {wf.name} (run {run.run_id})"
    try:
        keys = _stored_keys(decl, run.input, where)
    except (errors.LimitKeyError, errors.SerializationError) as exc:
        log.error("run %s: %s; running it without its limits", run.run_id, exc)
        return False, None
    delay = await _admit(
        limits, decl, keys, scope=limitrules.workflow_scope(wf.name), holder=run.run_id,
        run_id=run.run_id, kind="workflow", priority=wf.priority, wake=message,
    )  # fmt: skip
    if delay is None:
        return True, messages.ACK
    if delay > 0:
        return True, messages.Redeliver(delay)
    rt.limit_admitted.mark(message.run_id)
    return True, None


async def after_run(rt: Runtime, run_id: str) -> None:
    """After an acknowledged delivery of a limited run: if it ended, free its slots."""
    try:
        run = await rt.world.runs.get(run_id)
    except errors.RunNotFound:
        return
    if run.is_terminal:
        await release_run(rt.world, run_id)


async def release_run(world: contract.World, run_id: str) -> None:
    """Free everything the run holds or waits on (its end, or its cancel), and wake the
    waiters that takes in."""
    limits = store(world)
    if limits is not None:
        await send_wakes(world, await limits.release(run_id), cause=run_id)


# -- steps -----------------------------------------------------------------------------


def step_limits(rt: Runtime, step_name: str) -> limiting.Limits:
    return _decl(rt.steps.get(step_name))


async def gate_step(
    rt: Runtime, message: messages.StepMessage, step_input: Any
) -> messages.HandlerResult | None:
    """Before a limited step's attempt: None to run it, else ``Ack`` (waiting) or a
    ``Redeliver`` to its rate slot."""
    decl = step_limits(rt, message.step_name)
    if not decl.any:
        return None
    limits = require_store(rt.world, f"step {message.step_name}")
    where = f"step {message.step_name} (run {message.run_id})"
    try:
        keys = _stored_keys(decl, step_input, where)
    except (errors.LimitKeyError, errors.SerializationError) as exc:
        log.error("run %s: %s; running it without its limits", message.run_id, exc)
        return None
    delay = await _admit(
        limits, decl, keys, scope=limitrules.step_scope(message.step_name),
        holder=limitrules.step_holder(message.run_id, message.step_id), run_id=message.run_id,
        kind="step", priority=0, wake=message,
    )  # fmt: skip
    if delay is None:
        return messages.ACK
    return messages.Redeliver(delay) if delay > 0 else None


async def release_step(rt: Runtime, message: messages.StepMessage) -> None:
    if not step_limits(rt, message.step_name).any:
        return
    limits = store(rt.world)
    if limits is not None:
        holder = limitrules.step_holder(message.run_id, message.step_id)
        # One release per attempt: the cause names the attempt that frees the slot.
        cause = f"{holder}:{message.step_attempt}:{clock.now_ms()}"
        await send_wakes(rt.world, await limits.release(message.run_id, holder=holder), cause=cause)


# -- waking ----------------------------------------------------------------------------


async def send_wakes(
    world: contract.World, wakes: Sequence[limitrules.Wake], *, cause: str
) -> None:
    """Send each admissible waiter its stored message, under its wait's key and ``cause``
    (the holder whose release admits it, or the sweep's period): a second wake for one
    cause is deduplicated, a wake after a later release is not (a woken waiter a
    higher priority passed waits again, and must be woken again: sim seed 83)."""
    if not wakes:
        return
    sends = [
        messages.Send(messages.MESSAGE_ADAPTER.validate_json(w.message), f"{w.key}:{cause}", 0.0)
        for w in wakes
    ]
    await world.queue.send_batch(sends)
    for w in wakes:
        log.info("run %s: %s admitted by a limit; woken", w.run_id, w.holder)


async def sweeper(rt: Runtime) -> None:
    """The backstop: every ``TREADLE_LIMIT_SWEEP_SECONDS``, wake what a lost wake left."""
    limits = store(rt.world)
    if limits is None:
        return
    every = rt.settings.TREADLE_LIMIT_SWEEP_SECONDS
    while True:
        await asyncio.sleep(every)
        try:
            now = clock.now_ms()
            period = f"sweep:{now // int(every * 1000)}"
            await send_wakes(rt.world, await limits.sweep(now_ms=now), cause=period)
        except Exception as exc:  # a background loop: one failed pass never ends it
            log.warning("the limit sweep failed (%s); trying again in %.0f s", exc, every)
