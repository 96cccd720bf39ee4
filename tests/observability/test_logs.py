"""JSON log lines (issue 13 item 5): ``TREADLE_LOG_FORMAT=json`` gives one JSON object
per line with the time, level, logger, message, run id, step and trace ids."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import datetime

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from treadle import errors, settings
from treadle.telemetry import logs, scope, tracing


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """A JSON handler on the ``treadle`` logger writing to a buffer (restored after)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("treadle")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def _lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_line_names_the_run_from_its_message(captured: io.StringIO) -> None:
    logging.getLogger("treadle.orchestrator.x").warning(
        "run %s: something %d", "wrun_01ABCDEFGHJKMNPQRSTVWXYZ23", 3
    )
    (line,) = _lines(captured)
    assert line["level"] == "warning"
    assert line["logger"] == "treadle.orchestrator.x"
    assert line["message"] == "run wrun_01ABCDEFGHJKMNPQRSTVWXYZ23: something 3"
    assert line["run_id"] == "wrun_01ABCDEFGHJKMNPQRSTVWXYZ23"
    assert str(line["time"]).endswith("Z")
    datetime.fromisoformat(str(line["time"]).replace("Z", "+00:00"))
    assert "trace_id" not in line and "step" not in line


def test_a_line_takes_the_run_and_step_of_the_delivery_it_is_logged_in(
    captured: io.StringIO,
) -> None:
    run_token = scope.RUN_ID.set("wrun_fromthedelivery")
    step_token = scope.STEP.set("charge")
    try:
        logging.getLogger("treadle.x").info("no run named here")
    finally:
        scope.STEP.reset(step_token)
        scope.RUN_ID.reset(run_token)
    (line,) = _lines(captured)
    assert (line["run_id"], line["step"]) == ("wrun_fromthedelivery", "charge")


def test_a_record_s_own_run_id_wins(captured: io.StringIO) -> None:
    logging.getLogger("treadle.x").info(
        "run wrun_inthetext: hello", extra={"run_id": "wrun_explicit", "step": "s"}
    )
    (line,) = _lines(captured)
    assert (line["run_id"], line["step"]) == ("wrun_explicit", "s")


def test_a_line_inside_a_span_carries_its_trace_and_span_ids(
    captured: io.StringIO, spans: InMemorySpanExporter
) -> None:
    with tracing.span("test.span") as current:
        logging.getLogger("treadle.x").info("inside")
        ctx = current.get_span_context()
    (line,) = _lines(captured)
    assert line["trace_id"] == f"{ctx.trace_id:032x}"
    assert line["span_id"] == f"{ctx.span_id:016x}"


def test_an_exception_is_in_the_line_not_on_lines_of_its_own(captured: io.StringIO) -> None:
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        logging.getLogger("treadle.x").exception("failed")
    text = captured.getvalue()
    assert text.count("\n") == 1, "one record, one line"
    (line,) = _lines(captured)
    assert "ValueError: bad" in str(line["exception"])


def test_text_stays_the_default_and_a_bad_format_is_a_settings_error() -> None:
    assert logs.configure_logging({}) == "text"
    assert logs.configure_logging({"TREADLE_LOG_FORMAT": " text "}) == "text"
    with pytest.raises(errors.SettingsError, match="TREADLE_LOG_FORMAT='yaml' is not a log"):
        logs.configure_logging({"TREADLE_LOG_FORMAT": "yaml"})
    with pytest.raises(errors.SettingsError, match="TREADLE_LOG_FORMAT"):
        settings.load({"TREADLE_LOG_FORMAT": "yaml"})
    assert settings.load({"TREADLE_LOG_FORMAT": "json"}).TREADLE_LOG_FORMAT == "json"
