"""The in-memory World's streams (``contract.Streams``): chunks kept on the backend, so
every MemoryWorld over it (every simulated process) and a restart see them.

An append is synchronous once it runs (atomic on the loop) and follows
``streamrules.decide``; subscribers of the backend hear it at once. Built by
``world.MemoryWorld``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import JsonValue

from treadle import clock
from treadle.world import contract, records, streamrules

if TYPE_CHECKING:
    from treadle.testing.memory.backend import MemoryBackend


@dataclass
class _Stream:
    chunks: list[records.StreamChunk] = field(default_factory=list)
    closed: bool = False
    # (step_id, attempt) -> chunks that attempt stored.
    stored: dict[tuple[str, int], int] = field(default_factory=dict)


class StreamStore:
    """Every stream of one memory backend, and its subscribers."""

    def __init__(self) -> None:
        self.streams: dict[tuple[str, str], _Stream] = {}
        self.waiters = streamrules.Waiters()


def store_of(backend: MemoryBackend) -> StreamStore:
    """The backend's stream store (made on first use)."""
    store = getattr(backend, "stream_store", None)
    if store is None:
        store = StreamStore()
        backend.stream_store = store  # type: ignore[attr-defined]
    assert isinstance(store, StreamStore)
    return store


class MemoryStreams:
    def __init__(self, backend: MemoryBackend) -> None:
        self._backend = backend
        self._store = store_of(backend)

    async def append(
        self,
        run_id: str,
        name: str,
        chunks: Sequence[JsonValue],
        *,
        step_id: str,
        attempt: int,
        first_seq: int,
        close: bool = False,
    ) -> records.StreamAppend:
        streamrules.check_append_args(
            name, chunks, attempt=attempt, first_seq=first_seq, close=close
        )
        run = self._backend.store.run(run_id)
        stream = self._store.streams.get((run_id, name)) or _Stream()
        step = run.steps.get(step_id)
        state = streamrules.AppendState(
            run_id=run_id,
            name=name,
            run_ended=run.record.is_terminal,
            step_attempt=None if step is None else step.attempt,
            closed=stream.closed,
            stored=stream.stored.get((step_id, attempt), 0),
        )
        fate = streamrules.decide(
            state, attempt=attempt, first_seq=first_seq, count=len(chunks), close=close
        )
        if fate == "replayed":
            return records.StreamAppend(0, 0, stream.closed, replayed=True)
        self._store.streams[(run_id, name)] = stream
        first = len(stream.chunks)
        at = clock.utcnow()
        for i, data in enumerate(chunks):
            stream.chunks.append(
                records.StreamChunk(
                    index=first + i,
                    data=copy.deepcopy(data),
                    step_id=step_id,
                    attempt=attempt,
                    seq=first_seq + i,
                    created_at=at,
                )
            )
        stream.stored[(step_id, attempt)] = first_seq + len(chunks)
        stream.closed = stream.closed or close
        self._store.waiters.notify(run_id, name)
        return records.StreamAppend(first, len(chunks), stream.closed)

    async def read(
        self, run_id: str, name: str, *, start: int = 0, limit: int = 1000
    ) -> records.StreamPage:
        streamrules.check_read_args(name, start, limit)
        run = self._backend.store.run(run_id)
        stream = self._store.streams.get((run_id, name)) or _Stream()
        return records.StreamPage(
            chunks=tuple(copy.deepcopy(stream.chunks[start : start + limit])),
            count=len(stream.chunks),
            closed=stream.closed,
            run_ended=run.record.is_terminal,
        )

    async def list(self, run_id: str) -> list[records.StreamInfo]:
        self._backend.store.run(run_id)
        return [
            records.StreamInfo(name, len(stream.chunks), stream.closed)
            for (rid, name), stream in sorted(self._store.streams.items())
            if rid == run_id
        ]

    def subscribe(
        self, run_id: str, name: str, on_append: contract.StreamCallback
    ) -> contract.Subscription:
        return self._store.waiters.add(run_id, name, on_append)


def chunks_of(backend: MemoryBackend) -> dict[tuple[str, str], list[records.StreamChunk]]:
    """Every stored chunk by (run id, stream name) (the simulation's invariants)."""
    return {key: list(s.chunks) for key, s in store_of(backend).streams.items()}
