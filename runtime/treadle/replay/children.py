"""Child workflows in the replay (docs/children.md): the rules of a child call.

A child call takes the next position like a step; its creation is ``child_created``
(in-band, written by the orchestrator at the next suspension) and its result is the
``child_completed`` or ``child_failed`` the child's end writes into the parent's log,
resolved when the walk reaches it, as a step's outcome is.

Called by ``replay.engine``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from treadle import errors, serde
from treadle.replay import operations
from treadle.world import events, ids
from treadle.world.constants import SPEC_VERSION_SINGLE_ORCHESTRATOR

if TYPE_CHECKING:
    from treadle.replay.engine import Replay


def child_run_id(parent_run_id: str, correlation_id: str) -> str:
    """The child's run id: derived from the parent run and the call's correlation id, so
    a redelivery that creates the child again names the same run (a keyed run id)."""
    return ids.keyed_run_id(f"child:{parent_run_id}:{correlation_id}")


def check_call(replay: Replay, workflow_name: str) -> None:
    """Refuse a child call before anything is recorded: a spec 8 run, a replay that
    knows no registry, or a workflow not registered where the parent runs."""
    scope = replay.child_scope
    if scope is not None and scope.spec_version < SPEC_VERSION_SINGLE_ORCHESTRATOR:
        raise errors.ChildWorkflowsNotSupported(
            f"run {replay.run_id} is spec {scope.spec_version}: child workflows (starting "
            f"workflow {workflow_name!r} from a workflow) need spec 9 runs; set "
            "WORKFLOW_SPEC_VERSION=9 on a World with the in-band fence"
        )
    if scope is None:
        raise errors.ChildWorkflowsNotSupported(
            f"run {replay.run_id}: this replay has no workflow registry, so it cannot start "
            f"child workflow {workflow_name!r}"
        )
    if workflow_name not in scope.workflows:
        known = ", ".join(sorted(scope.workflows)) or "none"
        raise errors.WorkflowNotFound(
            f"run {replay.run_id}: cannot start child workflow {workflow_name!r}: no workflow "
            f"of that name is registered (registered: {known}); nothing was recorded"
        )


def resolve(op: operations.ChildCall, event: events.Event) -> None:
    """Settle a child call's future with the outcome the walk reached."""
    if op.future.done():
        return
    if isinstance(event, events.ChildCompleted):
        try:
            value = serde.decode(event.output, f"child workflow {op.workflow_name} result")
        except errors.SerializationError as exc:
            op.future.set_exception(exc)
            return
        op.future.set_result(value)
    elif isinstance(event, events.ChildFailed):
        op.future.set_exception(
            errors.ChildWorkflowFailed(
                event.child_run_id,
                op.workflow_name,
                event.error.message,
                error_type=event.error.type,
                code=event.error.code,
                cancelled=event.cancelled,
            )
        )
