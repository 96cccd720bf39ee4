"""What the current task is working on, for log lines: the run and the step.

Set per delivery by ``treadle.telemetry.tracing`` (the run) and per step attempt by
``treadle.telemetry.hooks`` (the step); read by ``treadle.telemetry.logs``. Plain
context variables, so every task a delivery starts (inline bodies) sees them.
"""

from __future__ import annotations

import contextvars

RUN_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("treadle_run_id", default=None)
STEP: contextvars.ContextVar[str | None] = contextvars.ContextVar("treadle_step", default=None)
