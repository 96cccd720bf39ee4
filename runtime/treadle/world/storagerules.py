"""Storage rules every World's storage applies the same way: pure, no I/O.

- ``check_batch``: what ``create_batch`` accepts at all (one to
  ``MAX_BATCH_EVENTS`` step and wait events), decided before the fence.
- ``check_run_id``: a caller-chosen run id must be ``wrun_`` and a ULID.
- ``check_same_run``: a retried ``runs.create`` with a taken run id converges
  only on the same workflow, input and deployment ("a run id names one run").
- ``check_event_write``: ``events.create`` refuses the events a runs operation
  writes (``run_created``, ``run_repinned``).
- ``check_repin``: when ``runs.repin`` refuses (``RunNotRepinned``), in what order.

Used by the local and in-memory storages (``treadle.worlds.local``,
``treadle.testing.memory``) and by the Postgres one for the checks it makes in Python.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import JsonValue

from treadle import errors
from treadle.world import constants, events, ids

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
