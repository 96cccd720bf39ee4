"""The durable operations workflow code reaches, each at a position.

A position is handed out when the code *calls* the operation, in program
order, so it is the same on every replay of unchanged code. An operation is
``recorded`` once its creation event is in the log; until then it is new and
the orchestrator writes it at the next suspension.

Created by ``replay.engine.Replay``; read by the orchestrator.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeAlias

from pydantic import JsonValue

from treadle.replay.loop import DurableTimer

Kind: TypeAlias = Literal["step", "wait", "hook", "attr", "child"]


def correlation_id(kind: Kind, run_id: str, position: int) -> str:
    """A replay-stable id for the operation at ``position`` of a run."""
    digest = hashlib.blake2b(f"{run_id}:{position}".encode(), digest_size=10).hexdigest()
    return f"{kind}_{digest}"


@dataclass(eq=False)
class Operation:
    position: int
    correlation_id: str
    recorded: bool = False
    cancelled: bool = False

    @property
    def kind(self) -> Kind:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(eq=False)
class StepCall(Operation):
    step_name: str = ""
    input: JsonValue = None
    max_retries: int = 3
    # Set when the arguments could not be serialized: the step is created failed.
    input_error: str | None = None
    future: asyncio.Future[Any] = field(default_factory=lambda: _unbound())
    # A step with a concurrency or rate limit runs only from its own message (limitgate).
    background: bool = False

    @property
    def may_run_inline(self) -> bool:
        return self.input_error is None and not self.background

    @property
    def kind(self) -> Kind:
        return "step"

    def describe(self) -> str:
        return f"step {self.step_name}"


@dataclass(eq=False)
class Sleep(Operation):
    resume_at: datetime = field(default_factory=lambda: _unbound())
    timer: DurableTimer | None = None

    @property
    def kind(self) -> Kind:
        return "wait"

    def describe(self) -> str:
        return f"a sleep until {self.resume_at.isoformat()}"


@dataclass(eq=False)
class RunDeadline(Sleep):
    """The run timeout's durable wait, at position -1 (``treadle.runtimeouts``): its
    ``wait_completed``, where the walk reaches it, fails the run with ``RunTimedOut``."""

    seconds: float = 0.0

    def describe(self) -> str:
        return f"the run timeout at {self.resume_at.isoformat()}"


@dataclass(eq=False)
class HookWait(Operation):
    token: str = ""
    metadata: JsonValue = None
    future: asyncio.Future[Any] = field(default_factory=lambda: _unbound())
    # The conflict, visible to ``conflict()`` as soon as the creation is in the log.
    conflict_holder: str | None = None
    conflicted: bool = False
    dispose_requested: bool = False
    disposed: bool = False
    # Force-claim and token retention (issue 17 item 8; ``sdk.hooks.create_hook``).
    force: bool = False
    token_retention_until: datetime | None = None

    @property
    def kind(self) -> Kind:
        return "hook"

    def describe(self) -> str:
        return f"hook {self.token!r}"


@dataclass(eq=False)
class AttrWrite(Operation):
    """``set_attributes()`` in workflow code: one key's ``attr_set`` (issue 17 item 2).

    Never awaited and never in ``Suspended.new``: the orchestrator writes the replay's
    ``pending_attributes`` in-band before it acts on the pass (``orchestrator.attributes``).
    """

    key: str = ""
    value: JsonValue = None

    @property
    def kind(self) -> Kind:
        return "attr"

    def describe(self) -> str:
        return f"attribute {self.key!r}"


# -- child workflows (docs/children.md) ----------------------------------------------


@dataclass(frozen=True)
class ChildScope:
    """What a replay may start children of: the workflows registered where it runs, and
    the run's format (children need spec 9)."""

    workflows: Collection[str]
    spec_version: int


@dataclass(eq=False)
class ChildCall(Operation):
    workflow_name: str = ""
    input: JsonValue = None
    child_run_id: str = ""
    on_parent_close: Literal["cancel", "abandon"] = "cancel"
    start_on_latest: bool = False
    future: asyncio.Future[Any] = field(default_factory=lambda: _unbound())

    @property
    def kind(self) -> Kind:
        return "child"

    def describe(self) -> str:
        return f"child workflow {self.workflow_name}"


def _unbound() -> Any:
    raise TypeError("an operation field was left unset")
