"""``step_heartbeat(details)``: a long step says it is alive (Temporal's activity
heartbeats; docs/timeouts.md).

A beat is cheap: it records the details and the time in the attempt's ``Beats`` (a
lock and two assignments, from the body's thread or the loop) and nudges the attempt's
runner, which stores the latest details at most once per throttle interval
(``orchestrator.steptimeouts``), never one log event per beat. Outside a step run by
treadle (a step called as a plain function) it does nothing; in workflow code it is an
error, since a workflow has no attempt to keep alive.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from typing import Any

from pydantic import JsonValue

from treadle import clock, errors, serde
from treadle.sdk import context


class Beats:
    """One attempt's heartbeats, written by the body (any thread), read by its runner."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_beat: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._loop = loop
        self._on_beat = on_beat
        self.last = clock.now()  # the attempt's start counts as its first beat
        self.details: JsonValue = None
        self.count = 0

    def beat(self, details: JsonValue) -> None:
        with self._lock:
            self.last = clock.now()
            self.details = details
            self.count += 1
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None  # a sync body's thread
        if running is self._loop:
            self._on_beat()
        else:
            self._loop.call_soon_threadsafe(self._on_beat)

    def latest(self) -> tuple[float, JsonValue, int]:
        with self._lock:
            return self.last, self.details, self.count


BEATS: contextvars.ContextVar[Beats | None] = contextvars.ContextVar(
    "treadle_step_beats", default=None
)


def step_heartbeat(details: Any = None) -> None:
    """Tell treadle the running step is alive; ``details`` (any value the serializer
    takes, within ``treadle.limits``) is what the next attempt sees as
    ``step_metadata().heartbeat_details`` if this one fails or its process dies."""
    if context.current_replay() is not None:
        raise errors.WorkflowError(
            "step_heartbeat() is for step code; a workflow has no attempt to keep alive"
        )
    meta = context.STEP.get()
    if meta is None:
        return  # a step called as a plain function: nothing to keep alive
    encoded = serde.encode(details, f"step {meta.step_name} heartbeat details")
    beats = BEATS.get()
    if beats is not None:
        beats.beat(encoded)
