"""A run's place in its tree of child workflows: its parent and its children
(``treadle runs get``, the API's run detail and the inspector; docs/children.md).

The parent link is on the run's record; the children are read from the run's own log
(``child_created``, with the outcome its children reported), each child's status from
its record. Read-only: through the World contract, never a World's internals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from treadle import errors
from treadle.world import contract, events, records

# At most this many children get their record read (the rest show their log's word).
MAX_CHILD_READS = 200


@dataclass(frozen=True)
class ChildLink:
    run_id: str
    workflow_name: str
    correlation_id: str
    on_parent_close: str
    # The child's record status; "not created" before its run exists.
    status: str
    # "completed" / "failed" / "cancelled" once its outcome is in the parent's log.
    outcome: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "workflow": self.workflow_name,
            "correlation_id": self.correlation_id,
            "on_parent_close": self.on_parent_close,
            "status": self.status,
            "outcome": self.outcome,
        }


@dataclass(frozen=True)
class RunTree:
    parent_run_id: str | None = None
    parent_correlation_id: str | None = None
    children: tuple[ChildLink, ...] = field(default=())


def children_in(log: Sequence[events.LoggedEvent]) -> list[tuple[events.ChildCreated, str | None]]:
    """The children a log created, in order, each with the outcome reported (or None)."""
    created: dict[str, events.ChildCreated] = {}
    outcomes: dict[str, str] = {}
    for logged in log:
        event = logged.event
        if isinstance(event, events.ChildCreated):
            created.setdefault(event.correlation_id, event)
        elif isinstance(event, events.ChildCompleted):
            outcomes.setdefault(event.correlation_id, "completed")
        elif isinstance(event, events.ChildFailed):
            outcomes.setdefault(event.correlation_id, "cancelled" if event.cancelled else "failed")
    return [(c, outcomes.get(cid)) for cid, c in created.items()]


async def read_log(world: contract.World, run_id: str) -> list[events.LoggedEvent]:
    out: list[events.LoggedEvent] = []
    after = 0
    while True:
        page = await world.events.list(run_id, after_slot=after)
        out.extend(page.events)
        if not page.has_more:
            return out
        after = page.cursor


async def tree(
    world: contract.World,
    run: records.RunRecord,
    log: Sequence[events.LoggedEvent] | None = None,
) -> RunTree:
    """The run's parent link and children (``log``: the run's whole log, if read)."""
    held = log if log is not None else await read_log(world, run.run_id)
    links: list[ChildLink] = []
    for index, (created, outcome) in enumerate(children_in(held)):
        status = outcome or "unknown"
        if index < MAX_CHILD_READS:
            try:
                status = (await world.runs.get(created.child_run_id)).status
            except errors.RunNotFound:
                status = "not created"
        links.append(
            ChildLink(
                created.child_run_id,
                created.workflow_name,
                created.correlation_id,
                created.on_parent_close,
                status,
                outcome,
            )
        )
    return RunTree(run.parent_run_id, run.parent_correlation_id, tuple(links))
