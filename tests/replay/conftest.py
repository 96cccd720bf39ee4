"""Replay tests: no step body may run inside a replay (seed 004, "Deliveries"), and
every replay a test opened is closed afterwards, as the orchestrator does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import histories


@pytest.fixture(autouse=True)
def no_step_body_runs() -> Iterator[None]:
    histories.BODY_CALLS.clear()
    yield
    for replay in histories.OPENED:
        if not replay.loop.is_closed():
            replay.close()
    histories.OPENED.clear()
    ran, histories.BODY_CALLS[:] = list(histories.BODY_CALLS), []
    assert ran == [], f"step bodies ran during replay: {ran}"
