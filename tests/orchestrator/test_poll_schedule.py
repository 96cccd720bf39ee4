"""The tail poll's back-off while a delivery waits (seed 003
``WORKFLOW_ORCHESTRATOR_FEED_POLL_INTERVAL_MS``; audit section 5 "Observations": the
settings help promised "doubles up to 2x" while the code polled at a fixed interval)."""

from __future__ import annotations

from treadle.orchestrator.polling import PollSchedule


def _clean_polls(schedule: PollSchedule, n: int) -> list[int]:
    seen = []
    for _ in range(n):
        seen.append(schedule.interval_ms(feed_live=True))
        schedule.polled(clean=True)
    return seen


def test_with_a_live_feed_the_interval_doubles_per_clean_poll_up_to_twice_the_feed_interval() -> (
    None
):
    schedule = PollSchedule(poll_ms=2000, feed_poll_ms=10000)
    assert _clean_polls(schedule, 4) == [10000, 20000, 20000, 20000]


def test_an_unclean_poll_puts_it_back_at_the_no_feed_interval_then_it_doubles_again() -> None:
    schedule = PollSchedule(poll_ms=2000, feed_poll_ms=10000)
    schedule.polled(clean=True)
    schedule.polled(clean=False)  # found something the feed had not pushed, or failed
    assert _clean_polls(schedule, 6) == [2000, 4000, 8000, 16000, 20000, 20000]


def test_feed_trouble_resets_the_live_interval_at_once() -> None:
    schedule = PollSchedule(poll_ms=2000, feed_poll_ms=10000)
    _clean_polls(schedule, 3)
    schedule.trouble()
    assert schedule.interval_ms(feed_live=True) == 2000


def test_without_a_live_feed_it_polls_at_the_no_feed_interval_always() -> None:
    schedule = PollSchedule(poll_ms=2000, feed_poll_ms=10000)
    for _ in range(3):
        assert schedule.interval_ms(feed_live=False) == 2000
        schedule.polled(clean=True)
    assert schedule.interval_ms(feed_live=False) == 2000


def test_the_live_interval_is_never_below_the_no_feed_interval() -> None:
    """A feed interval of 0 (or below the no-feed one) polls at the no-feed interval."""
    assert _clean_polls(PollSchedule(poll_ms=2000, feed_poll_ms=0), 3) == [2000] * 3
    assert _clean_polls(PollSchedule(poll_ms=2000, feed_poll_ms=500), 3) == [2000] * 3
    assert _clean_polls(PollSchedule(poll_ms=200, feed_poll_ms=150), 3) == [200, 300, 300]


def test_a_no_feed_interval_of_0_turns_polling_off() -> None:
    schedule = PollSchedule(poll_ms=0, feed_poll_ms=10000)
    assert schedule.interval_ms(feed_live=True) == 0
    assert schedule.interval_ms(feed_live=False) == 0
