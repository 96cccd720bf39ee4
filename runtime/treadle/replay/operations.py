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
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeAlias

from pydantic import JsonValue

from treadle.replay.loop import DurableTimer

Kind: TypeAlias = Literal["step", "wait", "hook"]


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
class HookWait(Operation):
    token: str = ""
    metadata: JsonValue = None
    future: asyncio.Future[Any] = field(default_factory=lambda: _unbound())
    # The conflict, visible to ``conflict()`` as soon as the creation is in the log.
    conflict_holder: str | None = None
    conflicted: bool = False
    dispose_requested: bool = False
    disposed: bool = False

    @property
    def kind(self) -> Kind:
        return "hook"

    def describe(self) -> str:
        return f"hook {self.token!r}"


def _unbound() -> Any:
    raise TypeError("an operation field was left unset")
