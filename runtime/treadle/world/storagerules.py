"""Storage rules every World's storage applies the same way: pure, no I/O.

- ``check_batch``: what ``create_batch`` accepts at all (one to
  ``MAX_BATCH_EVENTS`` step and wait events), decided before the fence.
- ``check_run_id``: a caller-chosen run id must be ``wrun_`` and a ULID.
- ``check_same_run``: a retried ``runs.create`` with a taken run id converges
  only on the same workflow, input and deployment ("a run id names one run").
- ``check_event_write``: ``events.create`` refuses the events a runs operation
  writes (``run_created``, ``run_repinned``).
- ``check_repin``: when ``runs.repin`` refuses (``RunNotRepinned``), in what order.
- ``created_by`` / ``check_creation``: one creation per entity. Which earlier events of
  an event's correlation id (of the run, for ``run_started``) make it a duplicate
  creation, refused as ``EntityAlreadyCreated`` with the first creation's slot, nothing
  allocated (spec 8 runs have several writers; seed 003 "Spec 8 queues, as in earlier
  releases"). A World looks up the first such event and hands its slot here.
- ``outcome_attempt`` / ``check_outcome_attempt``: a step outcome (``step_completed``,
  ``step_failed``, ``step_retrying``) is taken only from the step's latest started
  attempt (``StaleStepOutcome`` otherwise), so a body that outlived its timeout or its
  lease cannot write its outcome once the next attempt started, however late it writes.
- ``check_spec_event``: an event only a spec 9 run's log may hold (``wake_requested``)
  on an earlier run is a ``WorldContractError`` naming the run and its version
  (``spec_event_refused`` builds it, for the Postgres World's mapping too).

Used by the local and in-memory storages (``treadle.worlds.local``,
``treadle.testing.memory``) and by the Postgres one for the checks it makes in Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from pydantic import JsonValue

from treadle import errors
from treadle.world import constants, events, ids

# A creating event type -> the earlier event types of its correlation id (of the run, for
# run_started) that mean the entity exists already. A step is created by step_created or
# by its inline first step_started; a hook's creation may have been stored as hook_conflict.
CREATION_TYPES: dict[str, frozenset[str]] = {
    "run_started": frozenset({"run_started"}),
    "step_created": frozenset({"step_created", "step_started"}),
    "wait_created": frozenset({"wait_created"}),
    "hook_created": frozenset({"hook_created", "hook_conflict"}),
}
# An inline creating step_started (attempt 1, inline) re-creates a step a step_created
# made; one an earlier inline start made is StaleStepStart (its attempt is not past 1).
INLINE_CREATION_TYPES: frozenset[str] = frozenset({"step_created"})
# Every event type a creation check looks for (what a World indexes).
CREATION_LOOKUP_TYPES: frozenset[str] = frozenset().union(*CREATION_TYPES.values())
# Events only a spec 9 run's log may hold: a spec 8 run never receives one.
SPEC_9_ONLY_TYPES: frozenset[str] = frozenset({"wake_requested"})

# Every run status (``records.RunStatus``), for checking arguments.
RUN_STATUSES: frozenset[str] = frozenset({"pending", "running", "completed", "failed", "cancelled"})


def check_batch(run_id: str, batch: Sequence[events.Event]) -> None:
    """Refuse a whole batch the contract does not allow (empty, too long, a foreign event)."""
    if not batch:
        raise errors.WorldContractError(
            f"run {run_id}: create_batch needs at least one event", run_id=run_id
        )
    if len(batch) > constants.MAX_BATCH_EVENTS:
        raise errors.WorldContractError(
            f"run {run_id}: a batch holds at most {constants.MAX_BATCH_EVENTS} events, "
            f"got {len(batch)}",
            run_id=run_id,
        )
    for index, item in enumerate(batch):
        if item.type not in events.BATCHABLE_TYPES:
            raise errors.WorldContractError(
                f"run {run_id}: batch item {index} is a {item.type} event; a batch carries "
                "step and wait events only",
                run_id=run_id,
            )


def check_list_args(run_id: str, after_slot: int, limit: int, what: str = "events.list") -> None:
    """A log listing's bounds: ``limit >= 1`` and ``after_slot >= 0``."""
    if limit < 1 or after_slot < 0:
        raise errors.WorldContractError(
            f"{what} needs limit >= 1 and after_slot >= 0 "
            f"(got limit {limit}, after_slot {after_slot})",
            run_id=run_id,
        )


def check_run_id(run_id: str | None) -> None:
    """A run id handed to ``runs.create`` must have the run id shape."""
    if run_id is not None and not ids.is_run_id(run_id):
        raise errors.WorldContractError(
            f"{run_id!r} is not a run id (expected wrun_ and a ULID)", run_id=run_id
        )


def check_same_run(
    run_id: str,
    held: events.RunCreated,
    *,
    workflow_name: str,
    input: JsonValue,
    deployment_id: str,
) -> None:
    """A retried create converges on the run it made; anything else is a contract error."""
    if (held.workflow_name, held.input, held.deployment_id) != (
        workflow_name,
        input,
        deployment_id,
    ):
        raise errors.WorldContractError(
            f"run {run_id} exists already with another workflow, input or "
            "deployment; a run id names one run",
            run_id=run_id,
        )


def check_count(statuses: Sequence[str] | None, limit: int | None) -> tuple[str, ...] | None:
    """``runs.count``'s arguments, checked the same in every World: the statuses as a
    tuple without repeats (``None``: any status)."""
    if limit is not None and limit < 1:
        raise errors.WorldContractError(f"runs.count needs limit >= 1 (or none), got {limit}")
    if statuses is None:
        return None
    if isinstance(statuses, str):
        raise errors.WorldContractError(
            f"runs.count takes a sequence of statuses, not the string {statuses!r}"
        )
    unique = tuple(dict.fromkeys(statuses))
    if not unique:
        raise errors.WorldContractError("runs.count needs at least one status (or none at all)")
    unknown = [s for s in unique if s not in RUN_STATUSES]
    if unknown:
        raise errors.WorldContractError(f"runs.count: unknown run status {unknown[0]!r}")
    return unique


def check_event_write(run_id: str, event: events.Event) -> None:
    """``events.create`` never writes what a runs operation writes (``run_created``,
    ``run_repinned``): those come with their run row change, in one transaction."""
    if event.type in events.WRITTEN_BY_RUNS:
        operation = "runs.create" if event.type == "run_created" else "runs.repin"
        raise errors.WorldContractError(
            f"run {run_id}: {event.type} is written by {operation}, not events.create",
            run_id=run_id,
        )


def check_repin_args(run_id: str, from_deployment: str, to_deployment: str) -> None:
    """A move names two different, non-empty deployments (else a contract error)."""
    if not from_deployment or not to_deployment or from_deployment == to_deployment:
        raise errors.WorldContractError(
            f"run {run_id}: runs.repin needs two different deployments, got "
            f"from {from_deployment!r} to {to_deployment!r}",
            run_id=run_id,
        )


def check_repin(
    run_id: str,
    *,
    status: str,
    current: str,
    from_deployment: str,
    to_deployment: str,
    target_retired: bool | None,
) -> None:
    """Whether ``runs.repin`` may move the run (``RunNotRepinned`` with why not).

    Decided in this order, inside the write's transaction: the run ended; the run is
    not on ``from_deployment`` (moved already by another mover, or never there); the
    target is unknown (``target_retired`` None: never registered) or retired.
    """
    check_repin_args(run_id, from_deployment, to_deployment)
    if status in ("completed", "failed", "cancelled"):
        raise errors.RunNotRepinned(run_id, reason="ended", detail=f"the run is {status}")
    if current != from_deployment:
        raise errors.RunNotRepinned(
            run_id,
            reason="not_on_from",
            detail=f"the run is on deployment {current}, not {from_deployment}",
        )
    if target_retired is None:
        raise errors.RunNotRepinned(
            run_id,
            reason="unknown_target",
            detail=f"deployment {to_deployment} was never registered",
        )
    if target_retired:
        raise errors.RunNotRepinned(
            run_id, reason="retired_target", detail=f"deployment {to_deployment} is retired"
        )


def is_inline_creation(event: events.Event) -> bool:
    """A ``step_started`` that creates its step: an inline step's first start."""
    return isinstance(event, events.StepStarted) and event.inline and event.attempt == 1


def created_by(event: events.Event) -> frozenset[str] | None:
    """The earlier event types of ``event``'s correlation id (of the run, for
    ``run_started``) that make ``event`` a second creation; None when ``event``
    creates nothing (no lookup needed)."""
    if isinstance(event, events.StepStarted):
        return INLINE_CREATION_TYPES if is_inline_creation(event) else None
    return CREATION_TYPES.get(event.type)


def check_creation(run_id: str, event: events.Event, first_slot: int | None) -> None:
    """Refuse a second creation: ``first_slot`` is the slot of the earliest event of
    ``created_by(event)`` for the event's correlation id, None when there is none.

    Decided after the run's terminal check and, for a ``step_started``, after the
    step's outcome check and before the stale-start one; for ``hook_created`` before
    the token claim, so re-creating the run's own hook never stores ``hook_conflict``.
    """
    if first_slot is not None:
        raise errors.EntityAlreadyCreated(
            run_id, correlation_id=event.correlation_id, event_type=event.type, slot=first_slot
        )


# A step outcome: the events that end (or retry) an attempt and name it.
OUTCOME_ATTEMPT_TYPES: frozenset[str] = frozenset(
    {"step_completed", "step_failed", "step_retrying"}
)


def outcome_attempt(event: events.Event) -> int | None:
    """The attempt a step outcome names; None for any other event, or for a
    ``step_completed`` of an earlier release (which names none: never checked)."""
    if isinstance(event, events.StepCompleted | events.StepFailed | events.StepRetrying):
        return event.attempt
    return None


def check_outcome_attempt(run_id: str, event: events.Event, latest_attempt: int | None) -> None:
    """Refuse a step outcome whose attempt is not the step's latest started attempt.

    ``latest_attempt`` is the highest attempt started for the step as the World's
    step row holds it (``step_created`` folds it to 0; None: the World has no row for
    the step). A step no attempt started yet (0 or None) takes an outcome naming any
    attempt: a step failed before its first start (arguments that cannot be stored, a
    message past its deliveries) names attempt 1. Otherwise the outcome must name
    exactly ``latest_attempt``: an older attempt was superseded by a redelivery's start
    (its body outlived its timeout, heartbeat or lease: docs/timeouts.md), and a newer
    one never started. Decided after the step's one-outcome check (``StepAlreadyEnded``
    stays the answer for an outcome after the step's outcome), in-band or out-of-band,
    spec 8 or 9. The Postgres function ``treadle_admit`` (migration 0019) mirrors it.
    """
    attempt = outcome_attempt(event)
    if attempt is None or not latest_attempt or attempt == latest_attempt:
        return
    assert event.correlation_id is not None
    raise errors.StaleStepOutcome(
        run_id,
        step_id=event.correlation_id,
        attempt=attempt,
        latest_attempt=latest_attempt,
        event_type=event.type,
    )


def spec_event_refused(
    run_id: str, spec_version: int, event_type: str
) -> errors.WorldContractError:
    """The refusal of a spec 9 event written to an earlier run."""
    return errors.WorldContractError(
        f"run {run_id} is spec {spec_version}: a {event_type} is a spec 9 event, and a "
        "spec 8 run never receives a spec 9 event; nothing was written",
        run_id=run_id,
    )


def check_spec_event(run_id: str, spec_version: int, event: events.Event) -> None:
    """Refuse an event only a spec 9 run may hold on an earlier run (before anything else
    of the event is decided: it is a caller's bug, not a race)."""
    if (
        event.type in SPEC_9_ONLY_TYPES
        and spec_version < constants.SPEC_VERSION_SINGLE_ORCHESTRATOR
    ):
        raise spec_event_refused(run_id, spec_version, event.type)


# -- Hook force-claim and token retention (issue 17 item 8; seed 003 "Force-claim") ------
#
# A ``hook_created`` whose token a hook holds: ``claim_decision`` says what the World does.
# A holder is "expired" when its run has ended and its retention has passed (or it never
# had one): its token is free. Another run's live or retained holder is force-claimed
# when the creation asks for ``force``, else the creation is stored as ``hook_conflict``;
# the creator's own run is never force-claimed (it disposes its hook instead). A claim
# writes ``forced_disposal`` into the holder's log (out-of-band) and stores the creation
# as ``claimed`` (naming the holder), in one transaction.


def holder_expired(*, run_ended: bool, retained_until: datetime | None, now: datetime) -> bool:
    """A hook row left by an ended run whose token is no longer reserved."""
    return run_ended and (retained_until is None or retained_until <= now)


def claim_decision(
    run_id: str, event: events.HookCreated, holder_run_id: str | None
) -> Literal["create", "conflict", "claim"]:
    """``create`` (the token is free), ``claim`` (take it) or ``conflict``."""
    if holder_run_id is None:
        return "create"
    if event.force and holder_run_id != run_id:
        return "claim"
    return "conflict"


def forced_disposal(hook_id: str, claimer_run_id: str) -> events.HookDisposed:
    """What the World writes into the victim's log when its token is force-claimed."""
    return events.HookDisposed(correlation_id=hook_id, force_claimed_by=claimer_run_id)


def claimed(event: events.HookCreated, victim_run_id: str) -> events.HookCreated:
    """The creation as stored after a force-claim: it names the run it took the token from."""
    return event.model_copy(update={"claimed_from": victim_run_id})


def conflict(event: events.HookCreated, holder_run_id: str) -> events.HookConflict:
    """The creation stored as ``hook_conflict`` (a token another hook holds)."""
    return events.HookConflict(
        correlation_id=event.correlation_id,
        token=event.token,
        holder_run_id=holder_run_id,
        position=event.position,
    )
