"""Fixtures of the observability tests: an in-memory span exporter handed to treadle's
telemetry (never the process-wide provider, which a process may set only once), the
metrics switched on, and a fast local World app; each undone after its test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from treadle import Workflows, metrics, settings, telemetry
from treadle.world import contract
from treadle.worlds.local import LocalWorld

FAST = {
    "WORKFLOW_ORCHESTRATOR_LINGER_MS": 300,
    "WORKFLOW_ORCHESTRATOR_POLL_INTERVAL_MS": 200,
    "WORKFLOW_STEP_RETRY_DELAY_SECONDS": 0.05,
}
TUNING = contract.QueueTuning(lease_seconds=5.0, backoff_base_seconds=0.05, backoff_max_seconds=0.5)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Every span treadle ends during the test, in order."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use_provider(provider)
    try:
        yield exporter
    finally:
        telemetry.use_provider(None)
        provider.shutdown()


@pytest.fixture
def metrics_on() -> Iterator[None]:
    metrics.enable()
    try:
        yield
    finally:
        metrics.enable(False)


@pytest.fixture
async def local_app(tmp_path: Path) -> AsyncIterator[Callable[..., Workflows]]:
    """``local_app(**settings)``: an app with its worker on a fresh local World."""
    apps: list[Workflows] = []

    def make(**overrides: Any) -> Workflows:
        tuned = settings.load({}, **{**FAST, **overrides})
        world = LocalWorld(tmp_path / f"world{len(apps)}", tuning=TUNING)
        app = Workflows(world=world, settings_=tuned, worker=True)
        apps.append(app)
        return app

    yield make
    for app in apps:
        await app.close(grace_seconds=2)
        world = app._world_arg
        if isinstance(world, LocalWorld):
            await world.close()
