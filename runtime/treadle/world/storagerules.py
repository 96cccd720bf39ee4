"""Storage rules every World's storage applies the same way: pure, no I/O.

- ``check_batch``: what ``create_batch`` accepts at all (one to
  ``MAX_BATCH_EVENTS`` step and wait events), decided before the fence.
- ``check_run_id``: a caller-chosen run id must be ``wrun_`` and a ULID.
- ``check_same_run``: a retried ``runs.create`` with a taken run id converges
  only on the same workflow, input and deployment ("a run id names one run").

Used by the local and in-memory storages (``treadle.worlds.local``,
``treadle.testing.memory``).
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
