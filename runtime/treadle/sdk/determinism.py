"""Replay-stable randomness for workflow code, seeded by the run id."""

from __future__ import annotations

import random as _random
import uuid as _uuid

from treadle.sdk import context


def random() -> float:
    """A float in [0, 1), the same on every replay of the run."""
    replay = context.current_replay()
    return _random.random() if replay is None else replay.next_random()


def uuid4() -> _uuid.UUID:
    """A version 4 UUID, the same on every replay of the run."""
    replay = context.current_replay()
    return _uuid.uuid4() if replay is None else replay.next_uuid4()
