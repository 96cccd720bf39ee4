"""One trace per run on the production World (issue 13 item 3): the ``traceparent``
rides NATS JetStream messages (a step message, a timer's schedule, a retried step's
redelivery) and every delivery of the run joins the run's trace."""

from __future__ import annotations

import asyncio

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tests.production.conftest import (
    ProductionHarness,
    harness,
    nats_server,
    pg_clones,
    pg_dsn,
    pg_server,
)

from treadle import Workflows, settings, sleep
from treadle.telemetry import names
from treadle.world import contract

__all__ = ["harness", "nats_server", "pg_clones", "pg_dsn", "pg_server"]

TUNING = contract.QueueTuning(lease_seconds=5.0, backoff_base_seconds=0.05, backoff_max_seconds=0.5)
FAST = {
    "WORKFLOW_ORCHESTRATOR_LINGER_MS": 300,
    "WORKFLOW_STEP_RETRY_DELAY_SECONDS": 0.05,
    "WORKFLOW_MAX_INLINE_STEPS": 0,
    "TREADLE_DEPLOYMENT_ID": "prod",
}


async def test_a_run_on_postgres_and_nats_is_one_trace(
    spans: InMemorySpanExporter, harness: ProductionHarness
) -> None:
    world = await harness.open(TUNING)
    app = Workflows(world=world, settings_=settings.load({}, **FAST), worker=True)
    tries: dict[int, int] = {}

    @app.step
    async def traced(i: int) -> int:
        tries[i] = tries.get(i, 0) + 1
        if i == 0 and tries[i] == 1:
            raise RuntimeError("once")
        return i

    @app.workflow
    async def flow() -> int:
        await sleep(0.5)
        return sum(await asyncio.gather(*(traced(i) for i in range(3))))

    try:
        run = await app.start(flow)
        assert await run.result(timeout=30) == 3
    finally:
        await app.close(grace_seconds=2)
        await world.close()
    finished = spans.get_finished_spans()
    (start,) = [s for s in finished if s.name == names.WORKFLOW_START]
    deliveries = [s for s in finished if s.name in (names.WORKFLOW_EXECUTE, names.STEP_DELIVER)]
    assert len([d for d in deliveries if d.name == names.STEP_DELIVER]) >= 4
    assert len([d for d in deliveries if d.name == names.WORKFLOW_EXECUTE]) >= 2
    for delivery in deliveries:
        assert delivery.context.trace_id == start.context.trace_id, delivery.name
        assert delivery.parent is not None
        assert delivery.parent.span_id == start.context.span_id
    attempts = [s for s in finished if s.name == names.STEP_EXECUTE]
    assert sorted(str((a.attributes or {})[names.STEP_OUTCOME]) for a in attempts) == [
        "completed", "completed", "completed", "retry",
    ]  # fmt: skip
