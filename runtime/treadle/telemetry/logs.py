"""JSON log lines on request: ``TREADLE_LOG_FORMAT=json``.

``configure_logging()`` reads ``TREADLE_LOG_FORMAT`` (``text``, the default, changes
nothing; ``json`` puts one ``JsonFormatter`` handler on stderr on the ``treadle``
logger, which every treadle logger, the operator's included, is under, at
``TREADLE_LOG_LEVEL`` or INFO; not propagated, so no root handler repeats it as text;
other libraries' loggers, kopf's and uvicorn's, are left as they are). Each record
becomes one JSON object on one line with ``time`` (UTC, ISO 8601), ``level``,
``logger``, ``message``, ``run_id`` and ``step`` when known, ``trace_id`` and
``span_id`` while a span is recording, and ``exception`` for a record with one.

The run id is taken from the record (``extra={"run_id": ...}``), else from the message
(treadle's lines name the run: ``run wrun_...: ...``), else from the delivery the line
was logged in (``scope.RUN_ID``); the step likewise (``scope.STEP``, set per step
attempt and step message delivery). Called by the CLI at start and by
``telemetry.configure()``; idempotent.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from treadle import errors
from treadle.telemetry import scope

try:
    from opentelemetry import trace

    _OTEL = True
except ImportError:  # pragma: no cover - the base install has no opentelemetry-api
    _OTEL = False

VARIABLE = "TREADLE_LOG_FORMAT"
FORMATS = ("text", "json")
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_RUN_ID = re.compile(r"\bwrun_[A-Za-z0-9_-]{1,64}")


class _State:
    json = False


def json_enabled() -> bool:
    return _State.json


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        run_id = getattr(record, "run_id", None)
        if not isinstance(run_id, str):
            found = _RUN_ID.search(message)
            run_id = found.group(0) if found else scope.RUN_ID.get()
        if run_id:
            out["run_id"] = run_id
        step = getattr(record, "step", None)
        step = step if isinstance(step, str) else scope.STEP.get()
        if step:
            out["step"] = step
        if _OTEL:
            ctx = trace.get_current_span().get_span_context()
            if ctx.is_valid:
                out["trace_id"] = f"{ctx.trace_id:032x}"
                out["span_id"] = f"{ctx.span_id:016x}"
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        return json.dumps(out, default=str, ensure_ascii=False)


def log_format(environ: Mapping[str, str] | None = None) -> str:
    """``TREADLE_LOG_FORMAT`` checked: ``SettingsError`` naming it for any other value."""
    value = (environ if environ is not None else os.environ).get(VARIABLE, "").strip()
    value = value or "text"
    if value not in FORMATS:
        raise errors.SettingsError(
            f"{VARIABLE}={value[:40]!r} is not a log format: use one of {', '.join(FORMATS)}"
        )
    return value


def configure_logging(environ: Mapping[str, str] | None = None) -> str:
    """Apply ``TREADLE_LOG_FORMAT``; returns the format in force."""
    env = environ if environ is not None else os.environ
    fmt = log_format(env)
    if fmt != "json":
        return fmt
    logger = logging.getLogger("treadle")
    if not any(isinstance(h.formatter, JsonFormatter) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        logger.addHandler(handler)
        # One line per record: not again through a root handler an app installed.
        logger.propagate = False
        if logger.level == logging.NOTSET:
            level = env.get("TREADLE_LOG_LEVEL", "").strip().upper()
            logger.setLevel(level if level in _LEVELS else logging.INFO)
    _State.json = True
    return fmt
