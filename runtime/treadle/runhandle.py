"""``Run``: the handle on one run that ``Workflows.start`` and ``get_run`` return.

It reads the run (its record, log, result, streams, attributes) and acts on it from
outside (cancel, wake up, set attributes), through the app's World. Split from
``treadle.client`` (which re-exports it as ``treadle.client.Run``; ``treadle.Run``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue

from treadle import errors, limits, limitview, resultwait, serde, streamread
from treadle import runwrites as out_of_band
from treadle.orchestrator import children as child_effects
from treadle.orchestrator import compat, limitgate
from treadle.world import attributes as run_attributes
from treadle.world import events, records, streamrules

if TYPE_CHECKING:
    from treadle.client import Workflows


class Run:
    """A handle on one run."""

    def __init__(self, app: Workflows, run_id: str) -> None:
        self.app = app
        self.run_id = run_id

    def __repr__(self) -> str:
        return f"<Run {self.run_id}>"

    async def get(self) -> records.RunRecord:
        """The run's record; ``waiting_on_limit`` says what limit it waits on, if any."""
        world = await self.app.world()
        (run,) = await limitview.annotate(world, [await world.runs.get(self.run_id)])
        return run

    async def status(self) -> str:
        return (await self.get()).status

    async def events(self) -> list[events.LoggedEvent]:
        world = await self.app.world()
        out: list[events.LoggedEvent] = []
        after = 0
        while True:
            page = await world.events.list(self.run_id, after_slot=after)
            out.extend(page.events)
            if not page.has_more:
                return out
            after = page.cursor

    async def result(self, timeout: float | None = None) -> Any:
        """The run's output; raises ``RunFailedError``, ``RunCancelledError`` or TimeoutError."""
        world = await self.app.world()
        poll = self.app.settings.TREADLE_RESULT_POLL_SECONDS
        run = await resultwait.RunEnd(world, self.run_id, poll).wait(timeout)
        self.app.use_payload_keys()
        return outcome(run)

    async def cancel(self, reason: str | None = None) -> None:
        """Cancel the run (out-of-band ``run_cancelled``); pending timers find it ended."""
        if reason is not None:
            limits.check_string(reason, "cancel reason")
        world = await self.app.world()
        compat.require_known_format(await world.runs.get(self.run_id))
        await world.events.create(self.run_id, events.RunCancelled(reason=reason), in_band=False)
        # Child workflows: the outcome to its parent, the close policy to its children.
        await child_effects.after_end(world, self.run_id)
        await limitgate.release_run(world, self.run_id)  # its slot, to the next waiter

    async def wake_up(self, waits: list[str] | None = None) -> int:
        """Ask the orchestrator to end the run's sleeps now; returns how many were asked.

        On a spec 9 run the request is recorded in the log (``wake_requested``) before
        the wake is sent, so it is not lost when the wake is coalesced into a running
        delivery. On a spec 8 run each asked sleep is completed here (out-of-band
        ``wait_completed``), then one wake is sent; the count is of the sleeps this call
        completed (one another writer completed first is not counted). On a run that
        has ended it records and sends nothing and returns 0 (no error): the World
        refuses writes to a terminal run (``RunExpired``), also when the run ends
        between the read here and the write. The wake carries the run's own version.
        """
        world = await self.app.world()
        run = compat.require_known_format(await world.runs.get(self.run_id))
        if run.is_terminal:
            return 0
        return await out_of_band.wake_up(world, run, await self.events(), waits)

    # -- attributes (issue 17 item 2, docs/attributes.md) ---------------------------------

    async def set_attributes(self, values: Mapping[str, Any]) -> None:
        """Set attributes of the run from outside it: one out-of-band ``attr_set`` per key.

        Checked before anything is written (``AttributeInvalid`` or a
        ``SerializationError`` naming the key); allowed on any run, spec 8 or 9, ended
        or not (attributes are labels, not work). ``RunNotFound`` for no such run."""
        checked = run_attributes.check_attributes(values, "run.set_attributes()", self.app.limits)
        world = await self.app.world()
        compat.require_known_format(await world.runs.get(self.run_id))
        for key, value in checked.items():
            await world.events.create(
                self.run_id, events.AttrSet(key=key, value=value), in_band=False
            )

    async def attributes(self) -> dict[str, JsonValue]:
        """The run's attributes as its record holds them (the fold of its log)."""
        return dict((await self.get()).attributes)

    # -- streams (issue 17 item 6, docs/streams.md) -------------------------------------

    def stream(self, name: str = "default", *, start: int = 0) -> AsyncIterator[Any]:
        """The values a step wrote to stream ``name`` (``get_writable``), from index
        ``start``, live: it waits for chunks while the run goes on, and ends once the
        stream is closed or the run ended. A bad name or start raises here."""
        streamread.check_args(name, start)
        return self._values(name, start)

    def stream_chunks(
        self, name: str = "default", *, start: int = 0
    ) -> AsyncIterator[streamread.Chunk]:
        """``stream``, each value with its index and the step attempt that wrote it."""
        streamread.check_args(name, start)
        return self._chunks(name, start)

    async def streams(self) -> list[records.StreamInfo]:
        """The run's streams: name, chunk count, closed."""
        return await streamrules.streams_of(await self.app.world()).list(self.run_id)

    async def _values(self, name: str, start: int) -> AsyncIterator[Any]:
        async for chunk in self._chunks(name, start):
            yield chunk.value

    async def _chunks(self, name: str, start: int) -> AsyncIterator[streamread.Chunk]:
        world = await self.app.world()
        self.app.use_payload_keys()
        poll = self.app.settings.TREADLE_STREAM_POLL_SECONDS
        async for stored in streamread.read_chunks(
            world, self.run_id, name, start=start, poll_seconds=poll
        ):
            yield streamread.decode(stored, name)


def outcome(run: records.RunRecord) -> Any:
    """An ended run's output, or its failure or cancellation raised."""
    if run.status == "completed":
        return serde.decode(run.output, f"run {run.run_id} output")
    if run.status == "cancelled":
        raise errors.RunCancelledError(run.run_id)
    error = run.error or events.ErrorInfo(message="unknown error")
    raise errors.RunFailedError(run.run_id, error.message, error_type=error.type)
