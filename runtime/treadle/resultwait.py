"""Waiting for a run to end: on the World's feed, polling only when the feed fails.

``Run.result`` reads the run once; unless it has ended, it subscribes to the
run's events after the slot that read saw (``events.subscribe``: the World's
feed reads what it missed, so an end committed between the read and the
subscription is still heard) and sleeps until the feed delivers the run's
terminal event, then reads the run again for its outcome. Nothing polls while the
feed works: on Postgres the feed is one LISTEN connection per World, and a read
per notification that names a slot past the subscription's cursor.

When the feed fails (``on_error``: its connection was lost) or cannot be set up
(``subscribe`` raises), the reason is logged once and the wait polls the run
every ``TREADLE_RESULT_POLL_SECONDS`` from then on. A working feed is still
checked every ``FEED_CHECK_SECONDS`` with one read; finding the run ended that
way is logged as a feed that missed it (a World bug, never expected).

Called by ``treadle.client.Run.result``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from treadle import clock
from treadle.world import contract, events, records

log = logging.getLogger("treadle.client.result")

# How often a wait on a working feed reads the run anyway (a safety net, not a poll).
FEED_CHECK_SECONDS = 60.0


class RunEnd:
    """One ``Run.result`` wait: the feed, or the poll after the feed failed."""

    def __init__(self, world: contract.World, run_id: str, poll_seconds: float) -> None:
        self._world = world
        self.run_id = run_id
        self.poll_seconds = poll_seconds
        self._news = asyncio.Event()
        self._ended = False
        self._sub: contract.Subscription | None = None
        # Why the feed is not used (None while it works).
        self.feed_failure: str | None = None

    async def wait(self, timeout: float | None) -> records.RunRecord:
        """The run's record once it has ended; TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else clock.monotonic() + timeout
        try:
            run = await self._world.runs.get(self.run_id)
            if not run.is_terminal:
                self._subscribe(run.seq)
            while not run.is_terminal:
                remaining = None if deadline is None else deadline - clock.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"run {self.run_id} is still {run.status} after {timeout} s")
                checking = self.feed_failure is None
                interval = FEED_CHECK_SECONDS if checking else self.poll_seconds
                full = remaining is None or remaining >= interval
                heard = await self._sleep(interval if full else remaining or 0.0)
                run = await self._world.runs.get(self.run_id)
                if run.is_terminal and checking and full and not heard:
                    log.warning(
                        "run %s: ended without its live feed telling Run.result (found by "
                        "the check every %s s)",
                        self.run_id,
                        FEED_CHECK_SECONDS,
                    )
            return run
        finally:
            if self._sub is not None:
                self._sub.close()

    def _subscribe(self, after_slot: int) -> None:
        try:
            self._sub = self._world.events.subscribe(
                self.run_id, after_slot, self._on_event, self._on_error
            )
        except Exception as exc:  # a World that cannot set its feed up: poll, and say so
            self._failed(exc)

    def _on_event(self, event: events.LoggedEvent) -> None:
        if event.type in events.RUN_TERMINAL_TYPES:
            self._ended = True
            self._news.set()

    def _on_error(self, exc: BaseException) -> None:
        self._failed(exc)
        self._news.set()

    def _failed(self, exc: BaseException) -> None:
        if self.feed_failure is not None:
            return
        self.feed_failure = f"{type(exc).__name__}: {exc}"
        log.warning(
            "run %s: Run.result cannot wait on the live feed (%s); polling every %s s",
            self.run_id,
            self.feed_failure,
            self.poll_seconds,
        )

    async def _sleep(self, seconds: float) -> bool:
        """Sleep until the feed has news or ``seconds`` pass; True when it heard the end."""
        if not self._ended:
            self._news.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._news.wait(), seconds)
        heard, self._ended = self._ended, False
        return heard
