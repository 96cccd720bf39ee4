"""Spans and the run's trace context, over ``opentelemetry-api`` only.

Library code never imports the OpenTelemetry SDK: without one configured (or without
``opentelemetry-api`` installed at all) every helper here is a no-op and no message
carries a trace context. ``treadle.telemetry.setup`` (or a test) installs a provider.

One trace per run. The start (``client.start_run``, span ``workflow.start``) stamps its
span's W3C ``traceparent`` on the start message; every message a delivery sends copies
the delivery's own message's ``traceparent`` (``carrier_for_send``), so each delivery
span (``workflow.execute``, ``step.deliver``) is a child of the run's start span and
the run's deliveries sit side by side under it. A message sent outside a delivery (a
wake-up, a hook resume, a cancel) takes the run's context when this process knows it
(``_RUNS``, filled at start and at every delivery), else the caller's current span. A
delivery whose message names another trace than the one this process knows for the run
is parented on the run's and *linked* to the message's (a resume from an HTTP request's
trace shows as a link). A message with no context starts a trace at its delivery,
which later messages then carry.

Who calls what: ``worldwrap`` (the World's queue wrapper) opens ``delivery`` around
every handler and ``stamp`` on every send; ``hooks`` (step attempts, the start) and the
write wrappers use ``span``; the spec 8 delivery calls ``add_to_current`` for seed 000's
counters.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from treadle import errors
from treadle.telemetry import names, scope
from treadle.world import messages

try:
    from opentelemetry import trace
    from opentelemetry.context import Context

    AVAILABLE = True
except ImportError:  # pragma: no cover - the base install has no opentelemetry-api
    AVAILABLE = False

AttributeValue: TypeAlias = str | bool | int | float
Message: TypeAlias = messages.OrchestratorMessage | messages.StepMessage

# The runs this process has seen and the trace context each one carries (bounded).
_RUNS_LIMIT = 10_000
_RUNS: collections.OrderedDict[str, str] = collections.OrderedDict()


class _Config:
    provider: Any = None  # a TracerProvider set by ``use_provider`` (setup or a test)


def use_provider(provider: Any) -> None:
    """Trace through ``provider`` (an SDK ``TracerProvider``); None: the global one.

    Tests hand their own provider here instead of setting the process-wide one, which
    OpenTelemetry lets a process set only once."""
    _Config.provider = provider
    _RUNS.clear()


def enabled() -> bool:
    """A provider records spans: ours, or a global one an application installed."""
    if not AVAILABLE:
        return False
    if _Config.provider is not None:
        return True
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def _tracer() -> trace.Tracer:
    provider = _Config.provider or trace.get_tracer_provider()
    tracer: trace.Tracer = provider.get_tracer("treadle")
    return tracer


def format_traceparent(ctx: trace.SpanContext) -> str | None:
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parse_traceparent(value: str | None) -> trace.SpanContext | None:
    """The remote span context of a ``traceparent`` the message boundary admitted."""
    if not value or not AVAILABLE:
        return None
    _, trace_id, span_id, flags = value.split("-")
    ctx = trace.SpanContext(
        trace_id=int(trace_id, 16),
        span_id=int(span_id, 16),
        is_remote=True,
        trace_flags=trace.TraceFlags(int(flags, 16) & 0x01),
    )
    return ctx if ctx.is_valid else None


def remember(run_id: str, traceparent: str) -> None:
    _RUNS[run_id] = traceparent
    _RUNS.move_to_end(run_id)
    if len(_RUNS) > _RUNS_LIMIT:
        _RUNS.popitem(last=False)


def known(run_id: str) -> str | None:
    """The trace context this process last saw for ``run_id``."""
    return _RUNS.get(run_id)


@dataclass
class Delivery:
    """The delivery the current task is in: its run, the context its sends carry, its
    span (None without tracing) and the counters ``add_to_current`` summed on it."""

    run_id: str
    carrier: str | None
    span: Any = None
    counters: dict[str, float] = field(default_factory=dict)


CURRENT: ContextVar[Delivery | None] = ContextVar("treadle_delivery", default=None)


def carrier_for_send(message: Message) -> str | None:
    """The ``traceparent`` a message about to be sent should carry (see the module doc)."""
    if message.traceparent is not None:
        return message.traceparent
    delivery = CURRENT.get()
    if delivery is not None and delivery.run_id == message.run_id and delivery.carrier:
        return delivery.carrier
    run = known(message.run_id)
    if run is not None:
        return run
    if AVAILABLE:
        return format_traceparent(trace.get_current_span().get_span_context())
    return None


def stamp(message: Message) -> Message:
    """``message`` with its run's trace context (unchanged when there is none)."""
    carrier = carrier_for_send(message)
    if carrier is None:
        return message
    if isinstance(message, messages.OrchestratorMessage) and message.run_input is not None:
        remember(message.run_id, carrier)  # a start: the run's trace from now on
    if carrier == message.traceparent:
        return message
    return message.model_copy(update={"traceparent": carrier})


def _run_context(run_id: AttributeValue | None) -> Context | None:
    """The run's trace as a parent, when no span is current and this process knows it."""
    if not isinstance(run_id, str) or trace.get_current_span().get_span_context().is_valid:
        return None
    known_run = parse_traceparent(known(run_id))
    if known_run is None:
        return None
    return trace.set_span_in_context(trace.NonRecordingSpan(known_run))


def _refusal(exc: BaseException) -> str | None:
    """The class name of a World refusal (a stale start, a superseded fence...): a
    decision of the World, not a failure of the call."""
    if isinstance(exc, errors.WorldError) and not isinstance(exc, errors.StorageUnavailable):
        return type(exc).__name__
    return None


@contextlib.contextmanager
def span(
    name: str,
    attributes: Mapping[str, AttributeValue | None] | None = None,
    *,
    on_refusal: Callable[[str], None] | None = None,
) -> Iterator[Any]:
    """A child span of the current one (None and no span without tracing).

    With no span current (a write or send outside any delivery: a hook resume, a
    cancel), a span about a run this process knows (``attributes[workflow.run_id]``)
    joins that run's trace instead of starting one of its own.

    A World refusal raised inside it is named on the span (``world.refusal``) and handed
    to ``on_refusal`` (a metric), with or without tracing; any other exception marks the
    span failed. The exception propagates either way."""
    manager: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if enabled():
        attrs = {k: v for k, v in (attributes or {}).items() if v is not None}
        manager = _tracer().start_as_current_span(
            name,
            context=_run_context(attrs.get(names.RUN_ID)),
            attributes=attrs,
            record_exception=False,
            set_status_on_exception=False,
        )
    with manager as current:
        try:
            yield current
        except Exception as exc:
            refusal = _refusal(exc)
            if refusal is not None:
                if on_refusal is not None:
                    on_refusal(refusal)
                if current is not None:
                    current.set_attribute(names.REFUSAL, refusal)
            elif current is not None:
                current.record_exception(exc)
                current.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)[:200]))
            raise


def _parent_and_links(message: Message) -> tuple[Context, list[trace.Link], str | None]:
    """Where a delivery's span hangs: the run's trace, linked to a foreign message's."""
    sent = parse_traceparent(message.traceparent)
    run = parse_traceparent(known(message.run_id))
    links: list[trace.Link] = []
    parent = sent or run
    if sent is not None and run is not None and sent.trace_id != run.trace_id:
        parent, links = run, [trace.Link(sent)]
    if parent is None:
        return Context(), links, None
    carrier = format_traceparent(parent)
    return trace.set_span_in_context(trace.NonRecordingSpan(parent)), links, carrier


def delivery_attributes(
    message: Message, meta: messages.DeliveryMeta
) -> dict[str, AttributeValue | None]:
    attrs: dict[str, AttributeValue | None] = {
        names.RUN_ID: message.run_id,
        names.MESSAGE_ID: meta.message_id,
        names.MESSAGING_SYSTEM: "treadle",
        names.MESSAGE_KIND: message.kind,
        names.DELIVERY_COUNT: meta.delivery_count,
        names.DELIVERY_ATTEMPT: meta.attempt,
        names.DELIVERY_RERUN: meta.rerun,
        names.SPEC_VERSION: message.spec_version,
        names.DEPLOYMENT_ID: message.deployment_id,
    }
    if isinstance(message, messages.StepMessage):
        attrs[names.WORKFLOW_NAME] = message.run_context.workflow_name
        attrs[names.STEP_ID] = message.step_id
        attrs[names.STEP_NAME] = message.step_name
    elif message.run_input is not None:
        attrs[names.WORKFLOW_NAME] = message.run_input.workflow_name
    return attrs


@contextlib.contextmanager
def delivery(message: Message, meta: messages.DeliveryMeta) -> Iterator[Delivery]:
    """The scope of one delivery: its span (``workflow.execute`` or ``step.deliver``), the
    trace context its sends carry, and the run id its log lines name."""
    run_token = scope.RUN_ID.set(message.run_id)
    step = message.step_name if isinstance(message, messages.StepMessage) else None
    step_token = scope.STEP.set(step)
    try:
        if not enabled():
            # Not tracing here: the context still rides on, so a tracing process after
            # this one keeps the run in one trace.
            carrier = message.traceparent or known(message.run_id)
            if message.traceparent is not None:
                remember(message.run_id, message.traceparent)
            current = Delivery(message.run_id, carrier)
            token = CURRENT.set(current)
            try:
                yield current
            finally:
                CURRENT.reset(token)
            return
        parent, links, carrier = _parent_and_links(message)
        name = names.STEP_DELIVER if message.kind == "step" else names.WORKFLOW_EXECUTE
        attrs = {k: v for k, v in delivery_attributes(message, meta).items() if v is not None}
        with _tracer().start_as_current_span(
            name,
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes=attrs,
            links=links,
        ) as current_span:
            if carrier is None:  # the first delivery of a run without context: a new trace
                carrier = format_traceparent(current_span.get_span_context())
            if carrier is not None:
                remember(message.run_id, carrier)
            current = Delivery(message.run_id, carrier, current_span)
            token = CURRENT.set(current)
            try:
                yield current
            finally:
                CURRENT.reset(token)
    finally:
        scope.STEP.reset(step_token)
        scope.RUN_ID.reset(run_token)


def add_to_current(name: str, value: float = 1) -> None:
    """Add ``value`` to the numeric attribute ``name`` of the current delivery's span.

    For the counters seed 000 puts on ``workflow.execute``: the spec 8 delivery calls
    ``add_to_current(names.INLINE_OWNED_RECOVERY_STEPS, 1)`` for each owned step it
    re-executes in crash recovery and ``add_to_current(names.INLINE_BACKSTOP_WAKES_ARMED,
    1)`` for each backstop wake it arms. Sums within the delivery (its coalesced re-runs
    each have their own span); outside a delivery it sets the attribute on the current
    span. A no-op without tracing; never raises.
    """
    current = CURRENT.get()
    if current is not None:
        total = current.counters.get(name, 0) + value
        current.counters[name] = total
        if current.span is not None:
            current.span.set_attribute(name, int(total) if float(total).is_integer() else total)
        return
    if AVAILABLE:
        trace.get_current_span().set_attribute(name, value)


def set_on_current(name: str, value: AttributeValue) -> None:
    """Set attribute ``name`` on the current delivery's span (or the current span)."""
    current = CURRENT.get()
    if current is not None:
        if current.span is not None:
            current.span.set_attribute(name, value)
        return
    if AVAILABLE:
        trace.get_current_span().set_attribute(name, value)
