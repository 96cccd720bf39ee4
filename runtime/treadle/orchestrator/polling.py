"""The tail poll's schedule while a delivery waits (seed 003 "The client side" of the live
event feed, ``WORKFLOW_ORCHESTRATOR_FEED_POLL_INTERVAL_MS``).

Without a live feed the poll runs every ``WORKFLOW_ORCHESTRATOR_POLL_INTERVAL_MS``
(``0`` turns polling off). While the feed is up it starts at the feed interval
and doubles per clean poll (one that found nothing the feed had not pushed),
up to twice the feed interval; a poll that found something, failed or timed
out, and feed trouble (a push that skipped a slot) put it back at the no-feed
interval at once. The live interval is never below the no-feed one, so a feed
interval of ``0`` polls at the no-feed interval.

``PollSchedule`` is pure; ``poll`` reads the tail once (a single attempt under
the read deadline) and tells the schedule whether the poll was clean. Used by
``orchestrator.delivery`` (``_wait_for_news``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from treadle.orchestrator.session import RunSession

# The live interval grows to at most this many times the feed interval.
MAX_BACKOFF_FACTOR = 2


class PollSchedule:
    def __init__(self, *, poll_ms: int, feed_poll_ms: int) -> None:
        self.poll_ms = poll_ms
        self.cap_ms = max(feed_poll_ms * MAX_BACKOFF_FACTOR, poll_ms)
        self._live_ms = max(feed_poll_ms, poll_ms)

    def interval_ms(self, *, feed_live: bool) -> int:
        """How long until the next poll; 0 when polling is off."""
        if self.poll_ms <= 0:
            return 0
        return self._live_ms if feed_live else self.poll_ms

    def polled(self, *, clean: bool) -> None:
        """A poll ended: a clean one doubles the live interval, any other resets it."""
        self._live_ms = min(self._live_ms * 2, self.cap_ms) if clean else self.poll_ms

    def trouble(self) -> None:
        """The feed showed it missed something: poll at the no-feed interval again."""
        self._live_ms = self.poll_ms


async def poll(session: RunSession, schedule: PollSchedule) -> bool:
    """One poll of the run's tail; True when it found news.

    Clean (the interval doubles) only when the feed was live before and after, the
    read answered within its deadline, found nothing the feed had not pushed, and
    left no gap behind; anything else puts the interval back at the no-feed one.
    """
    live = session.feed_live
    found = await session.poll_tail()
    clean = found is False and live and session.feed_live and not session.has_pending
    schedule.polled(clean=clean)
    return bool(found)
