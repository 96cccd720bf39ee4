"""Run timeouts (issue 17 item 5, docs/timeouts.md): where a run's timeout is recorded
and how the orchestrator reads it back.

A start records the run's timeout in ``run_created``'s input, beside the arguments, as
``{"args": [...], "kwargs": {...}, "timeout_s": 3600.0}``: the value of
``app.start(..., timeout=)`` or else the workflow's ``@app.workflow(timeout=)``. The
orchestrator never reads the code's timeout for a run: what was recorded at the run's
creation is its deadline (``created_at + timeout_s``), whatever a later deployment
declares. Replay turns it into a durable wait at position -1 (``replay.engine``), which
the orchestrator arms and completes like any sleep; its ``wait_completed``, reached by
the walk, fails the run with ``RunTimedOut``.
"""

from __future__ import annotations

import math

from pydantic import JsonValue

from treadle import errors
from treadle.sdk.durations import Duration, positive_seconds

KEY = "timeout_s"


def with_timeout(
    data: JsonValue, timeout: Duration | None, default: float | None, *, workflow: str
) -> JsonValue:
    """``data`` (the encoded arguments) with the run timeout recorded, if there is one.

    ``timeout`` (the start's own) wins over ``default`` (the workflow's); a bad one is a
    ValueError naming the workflow, before anything is recorded.
    """
    seconds = (
        positive_seconds(timeout, what=f"workflow {workflow}: start timeout")
        if timeout is not None
        else default
    )
    if seconds is None:
        return data
    if not isinstance(data, dict):
        raise ValueError(f"workflow {workflow}: a run timeout needs an args/kwargs input")
    return {**data, KEY: seconds}


def recorded(data: JsonValue) -> float | None:
    """The run timeout recorded in a run's input, or None (also for a malformed one:
    a foreign writer's value that is not a positive number is ignored, and logged by
    the caller)."""
    if not isinstance(data, dict):
        return None
    value = data.get(KEY)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    seconds = float(value)
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def require_spec9(seconds: float | None, spec_version: int, workflow: str) -> None:
    """A run timeout on a spec 8 run: ``FeatureNeedsSpec9`` at the start, nothing recorded."""
    if seconds is not None and spec_version < 9:
        raise errors.FeatureNeedsSpec9(f"workflow {workflow}: a run timeout")
