"""What a run's log says of its child workflows and its parent, folded one event at a
time (part of ``LogState``; docs/children.md).

Pure: no I/O. ``orchestrator.children`` acts on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import JsonValue

from treadle.world import events

# The events this fold reads (``LogState.apply`` hands it only these).
FOLDED: frozenset[str] = events.CHILD_TYPES | {"run_created"}


@dataclass
class ChildInfo:
    correlation_id: str
    child_run_id: str
    workflow_name: str
    input: JsonValue
    on_parent_close: events.OnParentClose
    start_on_latest: bool
    slot: int
    position: int | None = None
    # "child_completed" / "child_failed" once the child's outcome is in this log.
    outcome: str | None = None
    cancelled: bool = False


@dataclass
class ChildLog:
    parent_run_id: str | None = None
    parent_correlation_id: str | None = None
    children: dict[str, ChildInfo] = field(default_factory=dict)
    # Children created whose outcome this log does not hold yet.
    open: set[str] = field(default_factory=set)
    # Outcomes seen per child correlation id (the simulation's exactly-once invariant).
    outcomes_seen: dict[str, int] = field(default_factory=dict)

    def apply(self, logged: events.LoggedEvent) -> None:
        match logged.event:
            case events.RunCreated() as e:
                self.parent_run_id = e.parent_run_id
                self.parent_correlation_id = e.parent_correlation_id
            case events.ChildCreated() as e:
                if e.correlation_id not in self.children:
                    self.children[e.correlation_id] = ChildInfo(
                        e.correlation_id, e.child_run_id, e.workflow_name, e.input,
                        e.on_parent_close, e.start_on_latest, logged.slot, e.position,
                    )  # fmt: skip
                    self.open.add(e.correlation_id)
            case events.ChildCompleted() | events.ChildFailed() as e:
                cid = e.correlation_id
                self.outcomes_seen[cid] = self.outcomes_seen.get(cid, 0) + 1
                child = self.children.get(cid)
                if child is not None and child.outcome is None:
                    child.outcome = e.type
                    child.cancelled = isinstance(e, events.ChildFailed) and e.cancelled
                    self.open.discard(cid)
            case _:
                pass

    @property
    def involved(self) -> bool:
        """The run has a parent or children: its end has something to do."""
        return self.parent_run_id is not None or bool(self.children)

    def open_children(self) -> list[ChildInfo]:
        """Children without an outcome here, in creation order."""
        return sorted((self.children[c] for c in self.open), key=lambda c: c.slot)
