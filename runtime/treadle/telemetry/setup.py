"""Exporters from the standard OpenTelemetry variables: ``configure()``.

The only module of treadle that imports the OpenTelemetry SDK (``opentelemetry-sdk``),
and only inside ``configure()``. ``treadle worker`` and ``treadle serve`` call it once
at start; an application embedding treadle may call it too, or install its own global
``TracerProvider`` (``tracing.enabled()`` then sees it).

Traces are exported when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set, or ``OTEL_TRACES_EXPORTER`` names an
exporter (``otlp``, ``console``: one JSON span a line on stderr, never on a command's
stdout; ``none`` turns tracing off, as does
``OTEL_SDK_DISABLED=true``). ``otlp`` uses ``OTEL_EXPORTER_OTLP_PROTOCOL``
(``http/protobuf``, the default, or ``grpc``), which needs
``opentelemetry-exporter-otlp-proto-http`` (or ``-grpc``) installed; every other
``OTEL_EXPORTER_OTLP_*`` variable (headers, timeout, certificates, compression) is read
by that exporter itself, and ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` by
the SDK. Without any of these set, ``configure()`` changes nothing. A missing package
is one warning naming what to install, never an error: tracing stays off.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from treadle import metrics as metrics_module
from treadle.telemetry import logs, tracing

log = logging.getLogger("treadle.telemetry")

_OTLP = {
    "http/protobuf": ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "http"),
    "grpc": ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter", "grpc"),
}


class _State:
    provider: Any = None


def _exporter(name: str, environ: Mapping[str, str]) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # stderr, one JSON object a line: a command's stdout is its output (a run id, JSON).
        return ConsoleSpanExporter(
            out=sys.stderr, formatter=lambda span: span.to_json(indent=None) + "\n"
        )
    if name == "otlp":
        protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
        )
        module_name, extra = _OTLP.get(protocol, _OTLP["http/protobuf"])
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            log.warning(
                "tracing: OTEL_EXPORTER_OTLP_* is set but %s is not installed "
                "(pip install opentelemetry-exporter-otlp-proto-%s); no spans are exported",
                module_name,
                extra,
            )
            return None
        return module.OTLPSpanExporter()
    log.warning("tracing: OTEL_TRACES_EXPORTER names %r, which treadle does not know", name)
    return None


def configure(
    *,
    service_name: str = "treadle",
    metrics: bool = False,
    environ: Mapping[str, str] | None = None,
) -> bool:
    """Logs (``TREADLE_LOG_FORMAT``) and trace export from the environment, once; with
    ``metrics``, metrics are recorded too (a ``/metrics`` endpoint will expose them).
    Call it before the World is opened: its wrapper is put in place at the open.

    Returns True when spans are exported from now on. Idempotent."""
    env = environ if environ is not None else os.environ
    logs.configure_logging(env)
    if metrics:
        metrics_module.enable()
    if _State.provider is not None:
        return True
    if not tracing.AVAILABLE or env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    if not names:
        names = ["otlp"] if endpoint else []
    names = [n for n in names if n != "none"]
    if not names:
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "tracing: OTEL_* is set but the OpenTelemetry SDK is not installed "
            "(pip install 'treadle[observability]'); no spans are exported"
        )
        return False
    exporters = [e for e in (_exporter(n, env) for n in names) if e is not None]
    if not exporters:
        return False
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)  # the app's own spans join the same traces
    tracing.use_provider(provider)
    _State.provider = provider
    atexit.register(provider.shutdown)  # flush what the batch processor holds
    log.info("tracing: exporting spans through %s", ", ".join(names))
    return True
