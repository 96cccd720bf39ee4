"""Trace context at the message boundary and on the delivery span (issue 13 item 3):
the ``traceparent`` field's shape check, ``add_to_current`` for seed 000's counters, a
foreign context as a link, and ``configure()`` from the standard variables."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from treadle import Workflows, telemetry
from treadle.telemetry import names, tracing, worldwrap
from treadle.world import messages

RUN = "wrun_01ABCDEFGHJKMNPQRSTVWXYZ23"
GOOD = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
OTHER = "00-11111111111111111111111111111111-2222222222222222-01"


def _meta(**kw: int) -> messages.DeliveryMeta:
    return messages.DeliveryMeta(
        message_id="msg_1", delivery_count=kw.get("count", 1), attempt=1,
        invocation_started_at=0,
    )  # fmt: skip


@pytest.mark.parametrize(
    "value",
    [
        "",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
        "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\nX",
        12,
        {"a": 1},
    ],
)
def test_a_malformed_traceparent_is_dropped_and_the_message_kept(value: object) -> None:
    """A trace context is a hint: a bad one never dead-letters its message."""
    read = messages.MESSAGE_ADAPTER.validate_python(
        {"kind": "orchestrator", "run_id": RUN, "run_spec_version": 9, "traceparent": value}
    )
    assert read.traceparent is None


def test_a_well_formed_traceparent_survives_the_round_trip() -> None:
    sent = messages.OrchestratorMessage(run_id=RUN, run_spec_version=9, traceparent=GOOD)
    read = messages.MESSAGE_ADAPTER.validate_json(sent.model_dump_json())
    assert read.traceparent == GOOD
    # An older reader's model (no such field) ignores it: messages allow extra fields.
    assert messages.OrchestratorMessage.model_config.get("extra") == "ignore"


def test_add_to_current_sums_on_the_delivery_span(spans: InMemorySpanExporter) -> None:
    """The spec 8 delivery's two counters of seed 000, summed per delivery span."""
    message = messages.OrchestratorMessage(run_id=RUN, run_spec_version=8, traceparent=GOOD)
    with tracing.delivery(message, _meta()):
        telemetry.add_to_current(names.INLINE_OWNED_RECOVERY_STEPS, 1)
        telemetry.add_to_current(names.INLINE_OWNED_RECOVERY_STEPS, 2)
        telemetry.add_to_current(names.INLINE_BACKSTOP_WAKES_ARMED)
    (span,) = spans.get_finished_spans()
    assert span.name == names.WORKFLOW_EXECUTE
    assert span.attributes is not None
    assert span.attributes[names.INLINE_OWNED_RECOVERY_STEPS] == 3
    assert span.attributes[names.INLINE_BACKSTOP_WAKES_ARMED] == 1
    assert span.attributes[names.SPEC_VERSION] == 8
    assert span.parent is not None and span.parent.trace_id == int(GOOD.split("-")[1], 16)


def test_add_to_current_without_tracing_is_a_no_op() -> None:
    message = messages.OrchestratorMessage(run_id=RUN, run_spec_version=8)
    with tracing.delivery(message, _meta()):
        telemetry.add_to_current(names.INLINE_OWNED_RECOVERY_STEPS, 1)
    telemetry.add_to_current(names.INLINE_OWNED_RECOVERY_STEPS, 1)


def test_a_message_from_another_trace_is_linked_to_the_runs_delivery(
    spans: InMemorySpanExporter,
) -> None:
    """A resume sent from an HTTP request's trace: the delivery stays in the run's trace
    (known to this process) and links the request's context."""
    tracing.remember(RUN, GOOD)
    message = messages.OrchestratorMessage(run_id=RUN, run_spec_version=9, traceparent=OTHER)
    with tracing.delivery(message, _meta(count=1)):
        pass
    (span,) = spans.get_finished_spans()
    assert span.context.trace_id == int(GOOD.split("-")[1], 16)
    (link,) = span.links
    assert link.context.trace_id == int(OTHER.split("-")[1], 16)


def test_sends_in_a_delivery_carry_the_deliverys_context(spans: InMemorySpanExporter) -> None:
    message = messages.OrchestratorMessage(run_id=RUN, run_spec_version=9, traceparent=GOOD)
    step = messages.StepMessage(
        run_id=RUN, step_id="s1", step_name="x",
        run_context=messages.RunContext(spec_version=9, workflow_name="w"),
        step_created_at=datetime.now(UTC),
    )  # fmt: skip
    with tracing.delivery(message, _meta()):
        assert tracing.stamp(step).traceparent == GOOD
        other_run = step.model_copy(update={"run_id": "wrun_another"})
        assert tracing.stamp(other_run).traceparent != GOOD


def test_configure_changes_nothing_without_otel_variables() -> None:
    assert telemetry.configure(environ={}) is False
    assert telemetry.configure(environ={"OTEL_TRACES_EXPORTER": "none"}) is False


def test_configure_exports_to_the_console_exporter_named_by_otel_traces_exporter() -> None:
    """In a child process (a process sets its global tracer provider once): spans of a
    delivery come out through the exporter OTEL_TRACES_EXPORTER names; an OTLP endpoint
    without the OTLP exporter installed is one warning, not an error."""
    code = f"""
import logging, sys
logging.basicConfig(stream=sys.stderr)
from treadle import telemetry
from treadle.telemetry import tracing
from treadle.world import messages
assert telemetry.configure(environ={{"OTEL_TRACES_EXPORTER": "console",
                                    "OTEL_SERVICE_NAME": "obs-test"}})
m = messages.OrchestratorMessage(run_id={RUN!r}, run_spec_version=9)
meta = messages.DeliveryMeta(message_id="msg_1", delivery_count=1, attempt=1,
                             invocation_started_at=0)
with tracing.delivery(m, meta):
    pass
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert not done.stdout, "spans go to stderr: a command's stdout is its output"
    (span,) = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert span["name"] == "workflow.execute"
    assert span["resource"]["attributes"]["service.name"] == "obs-test"
    otlp = subprocess.run(
        [sys.executable, "-c", "import logging,sys; logging.basicConfig(); "
         "from treadle import telemetry; "
         "print(telemetry.configure(environ={'OTEL_EXPORTER_OTLP_ENDPOINT': 'http://x:4318'}))"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert otlp.returncode == 0, otlp.stderr
    try:
        installed = importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http")
    except ModuleNotFoundError:
        installed = None
    if installed is None:
        assert otlp.stdout.strip() == "False"
        assert "opentelemetry-exporter-otlp-proto-http" in otlp.stderr
    else:  # the exporter is installed here: the endpoint turns export on
        assert otlp.stdout.strip() == "True"


async def test_a_handler_that_raises_is_an_error_delivery_on_span_and_metric(
    spans: InMemorySpanExporter, metrics_on: None
) -> None:
    """The queue redelivers a raising handler with backoff; its delivery span is failed,
    names the result ``error`` and counts under ``result="error"``."""
    from opentelemetry.trace import StatusCode

    from treadle import metrics
    from treadle.telemetry import worldwrap

    async def raises(
        message: messages.OrchestratorMessage | messages.StepMessage, meta: messages.DeliveryMeta
    ) -> messages.HandlerResult:
        raise RuntimeError("handler broke")

    labels = {"kind": "orchestrator", "result": "error"}
    before = metrics.REGISTRY.get_sample_value("treadle_deliveries_total", labels) or 0
    message = messages.OrchestratorMessage(run_id=RUN, run_spec_version=9)
    with pytest.raises(RuntimeError, match="handler broke"):
        await worldwrap.traced_handler(raises)(message, _meta())
    (span,) = spans.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR
    assert (span.attributes or {})[names.DELIVERY_RESULT] == "error"
    assert metrics.REGISTRY.get_sample_value("treadle_deliveries_total", labels) == before + 1


def test_a_process_that_does_not_trace_still_carries_the_runs_context() -> None:
    """Metrics or JSON logs on, tracing off: the messages a delivery sends keep the
    ``traceparent`` they came with, and nothing mints a new one."""
    message = messages.OrchestratorMessage(run_id=RUN, run_spec_version=9, traceparent=GOOD)
    wake = messages.OrchestratorMessage(run_id=RUN, run_spec_version=9)
    with tracing.delivery(message, _meta()):
        assert tracing.stamp(wake).traceparent == GOOD
    fresh = messages.OrchestratorMessage(run_id="wrun_neverseen", run_spec_version=9)
    assert tracing.stamp(fresh).traceparent is None


async def test_with_telemetry_off_the_world_is_left_as_it_is(
    local_app: Callable[..., Workflows], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No tracing, metrics or JSON logs: ``Workflows.world()`` wraps nothing (the
    simulation and plain runs take exactly the paths they took before). The process's
    telemetry state is put back to off first: under xdist an earlier test in this
    worker process may have left a provider or metrics on (seen in CI)."""
    from opentelemetry import trace

    from treadle import metrics
    from treadle.telemetry import logs

    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(tracing._Config, "provider", None)
    monkeypatch.setattr(metrics._State, "enabled", False)
    monkeypatch.setattr(logs._State, "json", False)
    assert not telemetry.active()
    world = await local_app().world()
    assert not isinstance(world.queue, worldwrap.TracedQueue)
    assert not isinstance(world.events, worldwrap.TracedEvents)


async def test_with_tracing_on_the_world_is_wrapped_once(
    spans: InMemorySpanExporter, local_app: Callable[..., Workflows]
) -> None:
    world = await local_app().world()
    queue = world.queue
    assert isinstance(queue, worldwrap.TracedQueue)
    assert telemetry.instrument(world).queue is queue, "idempotent"
