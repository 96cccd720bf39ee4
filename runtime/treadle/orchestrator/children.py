"""Child workflows in the orchestrator: the effects of a parent's decisions, and what a
run's end owes its parent and children (docs/children.md, docs/plans/s8-ch.md).

- ``create``: a suspension's child calls are written in-band (``child_created``, the
  child's run id derived from the parent's run id and the call's correlation id); only
  after the commit is each child run created (``runs.create`` with that id, its parent
  link on the run and on ``run_created``) and started (a keyed start message). A
  redelivery repeats the effects (``ensure_open``): ``runs.create`` with an existing
  id returns the run, the keyed start is deduplicated (seed 003 "Consume after
  commit").
- ``after_terminal``: once a run's terminal event is in its log, whoever sees it (the
  delivery that wrote it, any later delivery of the ended run, ``Run.cancel``) writes
  the run's outcome into its parent's log (out-of-band ``child_completed`` /
  ``child_failed`` under the idempotency key ``child-outcome:<child run id>``, so every
  writer converges on one event) and wakes the parent; and applies the close policy
  to its children still running (``on_parent_close="cancel"``: an out-of-band
  ``run_cancelled`` in the child, its outcome reported, the child woken so that it
  does the same for its own children). A crash between the terminal commit and these
  writes is repaired by the redelivery, which finds the run ended.
- The parent repairs too: a redelivery's ``ensure_open`` finds a child that ended
  and writes its outcome itself (the same key).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from treadle import errors, runwrites
from treadle.orchestrator.childlog import ChildInfo
from treadle.orchestrator.logstate import LogState
from treadle.replay import engine, operations
from treadle.world import contract, events, records

if TYPE_CHECKING:
    from treadle.orchestrator.session import RunSession

log = logging.getLogger("treadle.orchestrator.children")

# A start_on_latest child refused because its latest retired meanwhile reads again.
LATEST_ATTEMPTS = 3


def outcome_key(child_run_id: str) -> str:
    return f"child-outcome:{child_run_id}"


def start_key(child_run_id: str) -> str:
    return f"child-start:{child_run_id}"


def creation(op: operations.ChildCall) -> events.ChildCreated:
    return events.ChildCreated(
        correlation_id=op.correlation_id,
        workflow_name=op.workflow_name,
        child_run_id=op.child_run_id,
        input=op.input,
        position=op.position,
        on_parent_close=op.on_parent_close,
        start_on_latest=op.start_on_latest,
    )


async def create(session: RunSession, new: Sequence[operations.Operation]) -> None:
    """Write the child calls' ``child_created`` (in-band), then create and start each."""
    calls = [op for op in new if isinstance(op, operations.ChildCall)]
    for call in calls:
        await session.write(creation(call))
    for call in calls:
        if session.stale():
            return  # the lease lapsed mid-way: the redelivery's ensure_open does the rest
        child = session.state.children.children.get(call.correlation_id)
        if child is not None:
            await ensure(session.rt.world, session.state, child, fresh=True, stale=session.stale)


async def before_end(session: RunSession, outcome: engine.Outcome) -> None:
    """A workflow that returns (or raises) right after starting a child it never awaited:
    the child is created first, then the run's end applies its close policy (as a
    Temporal workflow task's start-child command goes out before its completion)."""
    if isinstance(outcome, engine.Completed | engine.Failed) and session.replay is not None:
        await create(session, session.replay.unwritten_children())


async def ensure_open(
    world: contract.World, state: LogState, stale: Callable[[], bool] = lambda: False
) -> None:
    """A redelivery's repair: every open child exists and was sent its start; one that
    ended has its outcome in this log. ``stale``: the delivery was told its lease lapsed,
    so it writes nothing more (F3; its redelivery repairs: sim seed 411)."""
    for child in state.children.open_children():
        if stale():
            return
        await ensure(world, state, child, fresh=False, stale=stale)


async def ensure(
    world: contract.World,
    state: LogState,
    child: ChildInfo,
    *,
    fresh: bool,
    stale: Callable[[], bool] = lambda: False,
) -> None:
    if child.outcome is not None or state.terminal is not None:
        return  # decided, or the parent ended first: its close policy handles the rest
    try:
        record: records.RunRecord | None = await world.runs.get(child.child_run_id)
    except errors.RunNotFound:
        record = await _create_run(world, state, child)
    if record is None or stale():
        return
    if record.is_terminal:
        await report(world, record)  # the child ended and its report was lost: repaired
        return
    await world.queue.send(runwrites.wake_message(record), key=start_key(record.run_id))
    if fresh:
        # The parent may have been cancelled while the child was being created: a
        # cancel that listed the children before the child existed missed it.
        parent = await world.runs.get(state.run_id)
        if stale():
            return
        if parent.is_terminal and child.on_parent_close == "cancel":
            await cancel_child(world, child, f"parent run {state.run_id} is {parent.status}")


async def _create_run(
    world: contract.World, state: LogState, child: ChildInfo
) -> records.RunRecord | None:
    """The child run, on the parent's deployment unless it asked for the latest."""
    deployment = state.deployment_id
    assert deployment is not None
    for attempt in range(1, LATEST_ATTEMPTS + 1):
        if child.start_on_latest:
            deployment = await world.deployments.latest() or state.deployment_id
            assert deployment is not None
        try:
            record = await world.runs.create(
                workflow_name=child.workflow_name,
                input=child.input,
                deployment_id=deployment,
                spec_version=state.spec_version,
                run_id=child.child_run_id,
                parent_run_id=state.run_id,
                parent_correlation_id=child.correlation_id,
            )
        except errors.DeploymentRetired as exc:
            if child.start_on_latest and attempt < LATEST_ATTEMPTS:
                continue
            log.warning("run %s: child %s not created: %s", state.run_id, child.child_run_id, exc)
            await _write_outcome(
                world,
                state.run_id,
                events.ChildFailed(
                    correlation_id=child.correlation_id,
                    child_run_id=child.child_run_id,
                    error=events.ErrorInfo(message=str(exc), type="DeploymentRetired"),
                ),
            )
            return None
        log.info(
            "run %s: child run %s of workflow %s created on %s",
            state.run_id,
            record.run_id,
            child.workflow_name,
            record.deployment_id,
        )
        return record
    return None


def outcome_event(record: records.RunRecord) -> events.ChildCompleted | events.ChildFailed:
    """The outcome a child's record reports to its parent."""
    assert record.parent_correlation_id is not None
    cid = record.parent_correlation_id
    if record.status == "completed":
        return events.ChildCompleted(
            correlation_id=cid, child_run_id=record.run_id, output=record.output
        )
    if record.status == "cancelled":
        return events.ChildFailed(
            correlation_id=cid,
            child_run_id=record.run_id,
            error=events.ErrorInfo(message="the child run was cancelled", type="RunCancelled"),
            cancelled=True,
        )
    error = record.error or events.ErrorInfo(message="unknown error")
    return events.ChildFailed(correlation_id=cid, child_run_id=record.run_id, error=error)


async def report(world: contract.World, record: records.RunRecord) -> bool:
    """Write an ended child's outcome into its parent's log (once, whoever writes it);
    True when this call wrote it."""
    if record.parent_run_id is None or not record.is_terminal:
        return False
    return await _write_outcome(world, record.parent_run_id, outcome_event(record))


async def _write_outcome(
    world: contract.World, parent_run_id: str, event: events.ChildCompleted | events.ChildFailed
) -> bool:
    try:
        result = await world.events.create(
            parent_run_id,
            event,
            in_band=False,
            idempotency_key=outcome_key(event.child_run_id),
        )
    except errors.RunNotFound:
        log.warning("run %s: its parent %s does not exist", event.child_run_id, parent_run_id)
        return False
    return result.allocated > 0


async def wake(world: contract.World, run_id: str) -> None:
    """Wake a run that has not ended (a parent learning its child's outcome)."""
    try:
        record = await world.runs.get(run_id)
    except errors.RunNotFound:
        return
    if not record.is_terminal:
        await world.queue.send(runwrites.wake_message(record))


async def cancel_child(world: contract.World, child: ChildInfo, reason: str) -> None:
    """The cancel policy for one child: cancel it, report its end, wake it (its own
    children follow at its delivery)."""
    with contextlib.suppress(errors.RunExpired, errors.RunNotFound):
        await world.events.create(
            child.child_run_id, events.RunCancelled(reason=reason), in_band=False
        )
    try:
        record = await world.runs.get(child.child_run_id)
    except errors.RunNotFound:
        return  # never created: the parent ended before its creation
    await report(world, record)
    await world.queue.send(runwrites.wake_message(record))


async def after_terminal(
    world: contract.World, state: LogState, stale: Callable[[], bool] = lambda: False
) -> None:
    """What an ended run owes: its outcome to its parent, its close policy to its
    children. Idempotent; nothing to do (no I/O) for a run with neither. ``stale``: the
    caller's delivery was told its lease lapsed, so it writes nothing more (F3) and
    leaves the rest to its redelivery, which finds the run ended (sim seeds 110, 189)."""
    family = state.children
    if state.terminal is None or not family.involved or stale():
        return
    if family.parent_run_id is not None:
        record = await world.runs.get(state.run_id)
        if stale():
            return
        if await report(world, record):
            log.info("run %s: outcome reported to parent %s", state.run_id, family.parent_run_id)
        await wake(world, family.parent_run_id)
    ended = state.terminal.removeprefix("run_")
    for child in family.open_children():
        if stale():
            return
        if child.on_parent_close == "cancel":
            log.info("run %s: %s; cancelling child %s", state.run_id, ended, child.child_run_id)
            await cancel_child(world, child, f"parent run {state.run_id} {ended}")


async def after_end(world: contract.World, run_id: str) -> None:
    """After an out-of-band terminal write (``Run.cancel``, a delivery's out-of-band
    failure): ``after_terminal`` from the log, and a wake (its delivery repeats it if
    this process stops midway)."""
    record = await world.runs.get(run_id)
    if record.spec_version < 9:
        return
    state = LogState(run_id)
    after = 0
    while True:
        page = await world.events.list(run_id, after_slot=after)
        for event in page.events:
            state.apply(event)
        if not page.has_more:
            break
        after = page.cursor
    if not state.children.involved:
        return
    await world.queue.send(runwrites.wake_message(record))
    await after_terminal(world, state)
