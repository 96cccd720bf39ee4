"""The stream rules every World applies (``contract.Streams``), and the in-process
notifications of appends that the memory and local Worlds (and Postgres, for its own
writes) use.

``decide`` is the one decision of an append, made inside the World's transaction
from what it read there: the run's state, the step's latest started attempt, the
stream's count and closed flag, and how many chunks this attempt stored. The
Postgres function ``treadle_stream_append`` (migration 0012) makes the same
decisions in the same order; the conformance suite (``conformance.streams``)
holds the three Worlds to it.

The retry rule (docs/streams.md): a stream is append-only. Each chunk carries the
step attempt that wrote it and its place among that attempt's chunks (``seq``),
so the chunks of one attempt are dense and in order, and only the step's latest
started attempt may append: once attempt 2 started, attempt 1's late chunks are
refused. A retried step's chunks follow the abandoned attempt's; a reader that
wants only the surviving attempt's output keeps the chunks of the highest attempt.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import JsonValue

from treadle import errors
from treadle.world import contract

NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}")
DEFAULT_NAME = "default"
# The most chunks one append may carry (a writer's flush is at most its buffer).
MAX_APPEND_CHUNKS = 100_000
MAX_READ_LIMIT = 10_000


def check_name(name: object) -> str:
    """``name`` if it is a valid stream name, else ``StreamNameInvalid``."""
    if not isinstance(name, str):
        raise errors.StreamNameInvalid(name, f"a stream name is a str, not {type(name).__name__}")
    if not NAME_PATTERN.fullmatch(name):
        raise errors.StreamNameInvalid(
            name, "use 1 to 128 letters, digits or '_.:-', not starting with '.', ':' or '-'"
        )
    return name


def check_append_args(
    name: str, chunks: Sequence[JsonValue], *, attempt: int, first_seq: int, close: bool
) -> None:
    check_name(name)
    if not chunks and not close:
        raise errors.WorldContractError("streams.append with no chunks and no close")
    if len(chunks) > MAX_APPEND_CHUNKS:
        raise errors.WorldContractError(
            f"streams.append of {len(chunks)} chunks (at most {MAX_APPEND_CHUNKS})"
        )
    if attempt < 1 or first_seq < 0:
        raise errors.WorldContractError(
            f"streams.append needs attempt >= 1 and first_seq >= 0, got {attempt}, {first_seq}"
        )


def check_read_args(name: str, start: int, limit: int) -> None:
    check_name(name)
    if start < 0 or not 1 <= limit <= MAX_READ_LIMIT:
        raise errors.WorldContractError(
            f"streams.read needs start >= 0 and 1 <= limit <= {MAX_READ_LIMIT}"
        )


@dataclass(frozen=True, slots=True)
class AppendState:
    """What an append's transaction read: ``step_attempt`` is the step's latest started
    attempt (0: created, never started; None: no such step), ``stored`` the chunks the
    appending attempt stored already."""

    run_id: str
    name: str
    run_ended: bool
    step_attempt: int | None
    closed: bool
    stored: int


def decide(
    state: AppendState, *, attempt: int, first_seq: int, count: int, close: bool
) -> Literal["append", "replayed"]:
    """The append's fate (see ``contract.Streams.append`` for the order)."""
    if count > 0 and first_seq + count <= state.stored:
        return "replayed"  # a retry of an append that committed
    if count == 0 and close and state.closed:
        return "replayed"  # closing a closed stream
    if state.run_ended:
        raise errors.StreamWriteRefused(
            state.run_id, state.name, "run_ended", "the run ended; its streams take no chunk"
        )
    if state.step_attempt is None or state.step_attempt < attempt:
        raise errors.StreamWriteRefused(
            state.run_id,
            state.name,
            "not_started",
            f"attempt {attempt} of step {_step(state)} has no step_started in the log",
        )
    if state.step_attempt > attempt:
        raise errors.StreamWriteRefused(
            state.run_id,
            state.name,
            "stale_attempt",
            f"attempt {state.step_attempt} of the step started after attempt {attempt}",
        )
    if state.closed:
        raise errors.StreamClosedError(state.run_id, state.name, "a writer closed the stream")
    if first_seq != state.stored:
        raise errors.WorldContractError(
            f"run {state.run_id}: stream {state.name!r} append at seq {first_seq}, "
            f"but the attempt stored {state.stored} chunk(s)"
        )
    return "append"


def _step(state: AppendState) -> str:
    return "(none)" if state.step_attempt is None else f"(latest attempt {state.step_attempt})"


def streams_of(world: object) -> contract.Streams:
    """``world.streams``, or a clear error for a World that has none."""
    streams = getattr(world, "streams", None)
    if streams is None:
        raise errors.StreamError(
            f"the World {type(world).__name__} does not store streams (docs/streams.md)"
        )
    return streams  # type: ignore[no-any-return]


class _Listen:
    def __init__(self, waiters: Waiters, key: tuple[str, str], callback: contract.StreamCallback):
        self._waiters = waiters
        self.key = key
        self.callback = callback
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._waiters.remove(self)

    def fire(self) -> None:
        if not self.closed:
            self.callback()


class Waiters:
    """Subscriptions to streams in this process; ``notify`` calls them soon after."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], list[_Listen]] = {}

    def add(self, run_id: str, name: str, callback: contract.StreamCallback) -> _Listen:
        listen = _Listen(self, (run_id, name), callback)
        self._by_key.setdefault(listen.key, []).append(listen)
        return listen

    def remove(self, listen: _Listen) -> None:
        listens = self._by_key.get(listen.key)
        if listens and listen in listens:
            listens.remove(listen)
            if not listens:
                del self._by_key[listen.key]

    def notify(self, run_id: str, name: str) -> None:
        listens = self._by_key.get((run_id, name))
        if not listens:
            return
        loop = asyncio.get_running_loop()
        for listen in list(listens):
            loop.call_soon(listen.fire)

    def close(self) -> None:
        for listens in list(self._by_key.values()):
            for listen in list(listens):
                listen.close()
