"""A logger for workflow code that stays silent while replay re-runs recorded history.

Workflow code runs again from the start on every delivery; a plain logger would
repeat every line each time. ``workflow_logger()`` drops records made while the
code has not yet reached every operation the log records (it is re-running
history), so each line appears once, when the code first gets there. Outside a
workflow it logs as usual.
"""

from __future__ import annotations

import logging

from treadle.sdk import context


class _SilentWhileReplaying(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        replay = context.current_replay()
        if replay is None:
            return True
        record.run_id = replay.run_id
        return not replay.is_replaying


def workflow_logger(name: str = "treadle.workflow") -> logging.Logger:
    """The named logger, with records made during replay of recorded history dropped."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, _SilentWhileReplaying) for f in logger.filters):
        logger.addFilter(_SilentWhileReplaying())
    return logger
