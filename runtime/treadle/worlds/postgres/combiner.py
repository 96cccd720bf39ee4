"""The Postgres World's write combiner: out-of-band writes of one run, grouped.

Every append locks its run's row (``treadle_append``: the fence and the slot
counter), so concurrent writes to one run queue on that lock, each with a
connection, a transaction and a commit of its own: a fan-out's step starts and
outcomes (100 or 1,000 background steps of one run finishing at once) paid one
commit each, in turn. Here an out-of-band ``events.create`` of a run with no write
of this combiner in flight is written at once, alone, as before; one that arrives
while a write of that run is in flight waits, and when the write returns every
call that queued meanwhile goes in one statement and one transaction
(``treadle_append_group``, migration 0011; at most ``GROUP_MAX_EVENTS`` at a time).

Each caller hears what it would have heard written alone: its own ``EventResult``
or its own refusal (``StepAlreadyEnded``, ``StaleStepStart``, ``RunExpired``...,
decided by ``treadle_admit`` against the log as the group's earlier items left
it, the order the writes would have taken the lock in). A refused item never
fails its neighbours. When the group's statement fails as a whole:

- ``StorageUnavailable`` (the connection was lost, the server went away, a
  timeout): the outcome is unknown, and every caller of the group hears
  ``StorageUnavailable``, as a write of its own would have;
- any other refusal of the statement (a value Postgres cannot store, the run
  gone): each item is written again alone, so each caller gets its own answer
  and no item fails for another's value.

Only out-of-band writes without an idempotency key and of no run-level event
(run_started, the run's outcome, attr_set: they fold the run's row) are grouped
(``groupable``); every other write goes alone, as before. Grouped events are
offered to this World's feed subscriptions like any own write (``Feed.publish``).

On unless ``TREADLE_DATABASE_GROUP_WRITES=false`` (``PostgresStorage.connect(group_writes=
False)``). Session 7 left it off: on a loaded 2-core machine the benchmark's 1,000-branch
fan-out had ended later with it on (docs/plans/perf-pg.md). Measured again after run-ahead
and the recovery work (2026-12-02, interleaved, load 17): the last branch of a 100-way
fan-out started after 637 ms with it against 1,537 to 1,660 ms without, of 1,000 after
4.0 to 5.1 s against 11.5 to 12.0 s; a lone write is never delayed by it.

Called by ``storage.PostgresEvents``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from treadle import errors
from treadle.world import events, records
from treadle.worlds.postgres import append
from treadle.worlds.postgres.database import Database
from treadle.worlds.postgres.feed import Feed

log = logging.getLogger("treadle.worlds.postgres.combiner")

# The most writes one grouped statement carries; the rest go in the next one.
GROUP_MAX_EVENTS = 500
# Events that fold the run's row (status, output, attributes): never grouped.
SOLO_TYPES: frozenset[str] = frozenset(
    {
        "run_created",
        "run_started",
        "run_completed",
        "run_failed",
        "run_cancelled",
        "attr_set",
        "run_repinned",
    }
)

WriteAlone = Callable[[str, events.Event], Awaitable[records.EventResult]]


def groupable(event: events.Event, *, in_band: bool, idempotency_key: str | None) -> bool:
    """Whether a write may share a statement with others of its run."""
    return not in_band and idempotency_key is None and event.type not in SOLO_TYPES


@dataclass(slots=True)
class _Queued:
    event: events.Event
    payload: str
    answer: asyncio.Future[records.EventResult]


class Combiner:
    """Out-of-band writes per run: one at once, the ones that queue behind it as one."""

    def __init__(self, db: Database, feed: Feed, write_alone: WriteAlone) -> None:
        self._db = db
        self._feed = feed
        self._write_alone = write_alone
        # Runs with a write of this combiner in flight, and what queued behind it.
        self._busy: set[str] = set()
        self._queued: dict[str, list[_Queued]] = {}
        self._flushes: set[asyncio.Task[None]] = set()
        # How many grouped statements were sent and how many writes they carried.
        self.groups = 0
        self.grouped_writes = 0

    async def create(self, run_id: str, event: events.Event) -> records.EventResult:
        """Write ``event`` out of band: alone when the run has no write in flight,
        else with whatever else queued behind that write."""
        if run_id not in self._busy:
            self._busy.add(run_id)
            try:
                return await self._write_alone(run_id, event)
            finally:
                self._next(run_id)
        append.check_out_of_band_times(event)  # its own refusal, before it queues
        queued = _Queued(event, event.model_dump_json(), asyncio.get_running_loop().create_future())
        self._queued.setdefault(run_id, []).append(queued)
        return await queued.answer  # cancelled before it is sent: never sent

    def _next(self, run_id: str) -> None:
        """The run's write returned: send what queued behind it, or mark the run idle."""
        waiting = [q for q in self._queued.pop(run_id, ()) if not q.answer.done()]
        if not waiting:
            self._busy.discard(run_id)
            return
        group, rest = waiting[:GROUP_MAX_EVENTS], waiting[GROUP_MAX_EVENTS:]
        if rest:
            self._queued[run_id] = rest
        task = asyncio.get_running_loop().create_task(
            self._flush(run_id, group), name=f"treadle-pg-group-{run_id}"
        )
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _flush(self, run_id: str, group: list[_Queued]) -> None:
        try:
            await self._send(run_id, group)
        except Exception as exc:  # not a World error: every caller hears it
            for queued in group:
                _answer(queued, exc)
        finally:
            for queued in group:  # cancelled (the loop is closing): an unknown outcome
                _answer(queued, errors.StorageUnavailable(f"run {run_id}: the write was stopped"))
            self._next(run_id)

    async def _send(self, run_id: str, group: list[_Queued]) -> None:
        self.groups += 1
        self.grouped_writes += len(group)
        batch = [q.event for q in group]
        answers: list[records.EventResult | errors.WorldError] | None
        with self._feed.writing(run_id):
            try:
                answers = await append.create_group(
                    self._db, run_id, batch, [q.payload for q in group]
                )
            except errors.StorageUnavailable as exc:
                # The outcome is unknown: each caller hears it, as a write alone would.
                log.warning(
                    "run %s: a grouped append of %d writes failed: %s", run_id, len(group), exc
                )
                for queued in group:
                    lost = errors.StorageUnavailable(str(exc))
                    lost.__cause__ = exc
                    _answer(queued, lost)
                return
            except errors.WorldError as exc:
                # Refused whole, nothing written: each goes alone for its own answer.
                log.info(
                    "run %s: a grouped append was refused (%s); writing each alone", run_id, exc
                )
                answers = None
            else:
                committed = [a.event for a in answers if isinstance(a, records.EventResult)]
                if committed:
                    self._feed.publish(run_id, committed)
        if answers is None:
            for queued in group:
                try:
                    _answer(queued, await self._write_alone(run_id, queued.event))
                except errors.WorldError as exc:
                    _answer(queued, exc)
        else:
            for queued, answer in zip(group, answers, strict=True):
                _answer(queued, answer)


def _answer(queued: _Queued, answer: records.EventResult | BaseException) -> None:
    if queued.answer.done():
        return
    if isinstance(answer, BaseException):
        queued.answer.set_exception(answer)
    else:
        queued.answer.set_result(answer)
