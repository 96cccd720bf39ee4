"""Child workflows, as workflow code sees them (docs/children.md).

Inside a workflow, ``await other(...)`` (``other`` another ``@app.workflow``) starts a
child run and waits for its result; ``handle = await app.start(other, ...)`` starts one
and returns a ``ChildHandle`` at once, whose ``await handle.result()`` waits later.
``other.options(on_parent_close="abandon", start_on_latest=True)`` binds the options of
one call: ``await other.options(...)(x)`` or ``await app.start(other.options(...), x)``.
(A top-level start's options, ``attributes``, ``priority`` and ``timeout``, are
refused on a child call: a ``ValueError`` at the call, nothing recorded.)

A child's failure (or cancellation) is raised in the parent as
``ChildWorkflowFailed``, with the child's run id and error.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from treadle.replay import children as replay_children
from treadle.replay import engine
from treadle.sdk import context

if TYPE_CHECKING:
    from treadle.sdk.functions import WorkflowFunction

OnParentClose = Literal["cancel", "abandon"]
POLICIES: tuple[str, ...] = get_args(OnParentClose)


def check_policy(on_parent_close: str) -> OnParentClose:
    if on_parent_close not in POLICIES:
        raise ValueError(
            f"on_parent_close must be one of {', '.join(POLICIES)}, got {on_parent_close!r}"
        )
    return on_parent_close  # type: ignore[return-value]


@dataclass(frozen=True)
class ChildHandle:
    """A child run started without waiting: ``await handle.result()`` waits for it."""

    run_id: str
    workflow_name: str
    _future: asyncio.Future[Any]

    def result(self) -> asyncio.Future[Any]:
        """The child's result; raises ``ChildWorkflowFailed`` if it failed or was
        cancelled. Awaited in the parent workflow (durably: the parent may be replayed
        many times before the child ends)."""
        return self._future

    def __repr__(self) -> str:
        return f"<ChildHandle {self.workflow_name} {self.run_id}>"


@dataclass(frozen=True)
class ChildOptions:
    """A workflow with the options of one call bound (``WorkflowFunction.options``): a
    child call's (``on_parent_close``, ``start_on_latest``), or a top-level start's
    (``attributes``, ``priority``, ``timeout`` in seconds, ``start_on_latest``), which
    ``Workflows.start`` reads from here instead of its keywords."""

    workflow: WorkflowFunction[..., Any]
    on_parent_close: OnParentClose = "cancel"
    start_on_latest: bool | None = None
    attributes: dict[str, Any] | None = None
    priority: int | None = None
    timeout: float | None = None

    def start_options(self) -> list[str]:
        """The top-level start options bound here (a child run takes none of them)."""
        bound = {"attributes": self.attributes, "priority": self.priority}
        return [k for k, v in {**bound, "timeout": self.timeout}.items() if v is not None]

    @property
    def name(self) -> str:
        return self.workflow.name

    def __call__(self, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        replay = context.require_replay(f"a child call of workflow {self.name}")
        return start(replay, self, args, kwargs).result()


def start(
    replay: engine.Replay,
    child: ChildOptions,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> ChildHandle:
    """Take the child call's position (nothing is written until the next suspension).

    Bad input raises here, at the call, before anything is recorded: an unknown
    workflow (``WorkflowNotFound``), arguments that cannot be serialized
    (``SerializationError``), a spec 8 run (``ChildWorkflowsNotSupported``).
    """
    from treadle.sdk.functions import encode_arguments

    name = child.name
    if child.start_options():
        raise ValueError(
            f"child workflow {name}: {', '.join(child.start_options())} "
            "(.options() or app.start keywords) are options of a top-level start; a child "
            "run takes none of them (docs/children.md)"
        )
    replay_children.check_call(replay, name)  # the workflow first, then its arguments
    data = encode_arguments(args, kwargs, f"child workflow {name}")
    on_latest = child.start_on_latest
    if on_latest is None:
        on_latest = child.workflow.start_on_latest
    op = replay.call_child(
        name, data, on_parent_close=child.on_parent_close, start_on_latest=on_latest
    )
    return ChildHandle(op.child_run_id, name, op.future)
