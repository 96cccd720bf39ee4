"""OpenTelemetry spans of a run (issue 13 item 3), on the local World with the SDK's
in-memory exporter: one trace per run from ``start()`` through every message, a
``workflow.execute`` span per orchestrator delivery and a ``step.deliver`` span per step
message delivery (children of the run's ``workflow.start``), a ``step.execute`` span per
step attempt, and a span per World write and send."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from treadle import Workflows
from treadle.errors import HookNotFound
from treadle.telemetry import names


def _named(finished: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in finished if s.name == name]


def _parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_a_fan_out_with_a_retry_is_one_trace_under_its_start_span(
    spans: InMemorySpanExporter, local_app: Callable[..., Workflows]
) -> None:
    """Four steps fanned out (one inline, three from their messages), one of them failing
    its first attempt: every span of the run is in one trace; each delivery hangs under
    the run's ``workflow.start``; each step attempt under the delivery that ran it."""
    app = local_app(WORKFLOW_MAX_INLINE_STEPS=1)
    tries: dict[int, int] = {}

    @app.step
    async def work(i: int) -> int:
        tries[i] = tries.get(i, 0) + 1
        if i == 2 and tries[i] == 1:
            raise RuntimeError("flaky once")
        return i * 10

    @app.workflow
    async def fan(n: int) -> int:
        return sum(await asyncio.gather(*(work(i) for i in range(n))))

    run = await app.start(fan, 4)
    assert await run.result(timeout=30) == 60
    await app.close(grace_seconds=2)
    finished = spans.get_finished_spans()

    (start,) = _named(finished, names.WORKFLOW_START)
    assert start.parent is None
    assert start.attributes is not None
    assert start.attributes[names.RUN_ID] == run.run_id
    assert start.attributes[names.WORKFLOW_NAME] == "fan"
    trace_id = start.context.trace_id
    run_spans = [s for s in finished if (s.attributes or {}).get(names.RUN_ID) == run.run_id]
    assert {s.context.trace_id for s in run_spans} == {trace_id}, "the run is one trace"
    by_id = {s.context.span_id: s for s in finished}

    executes = _named(finished, names.WORKFLOW_EXECUTE)
    delivers = _named(finished, names.STEP_DELIVER)
    assert executes, "no workflow.execute span"
    assert len(delivers) >= 3 + 1, "three background steps, one redelivered for its retry"
    for delivery in executes + delivers:
        assert _parent_id(delivery) == start.context.span_id, delivery.name
        attrs = delivery.attributes or {}
        assert attrs[names.RUN_ID] == run.run_id
        assert attrs[names.DELIVERY_RESULT] in ("ack", "redeliver", "handoff")
        assert attrs[names.DELIVERY_COUNT] >= 1
        assert attrs[names.SPEC_VERSION] == 9
    assert any((e.attributes or {}).get(names.WORKFLOW_NAME) == "fan" for e in executes)
    assert (executes[-1].attributes or {})[names.DELIVERY_RESULT] == "ack"

    attempts = _named(finished, names.STEP_EXECUTE)
    assert len(attempts) == 5, "four steps, one of them twice"
    for attempt in attempts:
        parent = by_id[_parent_id(attempt) or 0]
        assert parent.name in (names.WORKFLOW_EXECUTE, names.STEP_DELIVER)
    flaky = sorted(
        (a for a in attempts if (a.attributes or {}).get(names.STEP_OUTCOME) == "retry"),
        key=lambda s: s.start_time or 0,
    )
    assert len(flaky) == 1
    flaky_id = (flaky[0].attributes or {})[names.STEP_ID]
    again = [a for a in attempts if (a.attributes or {})[names.STEP_ID] == flaky_id]
    assert [(a.attributes or {})[names.STEP_ATTEMPT] for a in again] == [1, 2]
    assert (again[1].attributes or {})[names.STEP_OUTCOME] == "completed"
    # The retry's second attempt ran from a redelivery of the step's message.
    retried_in = by_id[_parent_id(again[1]) or 0]
    assert retried_in.name == names.STEP_DELIVER
    assert (retried_in.attributes or {})[names.DELIVERY_ATTEMPT] >= 2

    writes = _named(finished, names.EVENTS_CREATE) + _named(finished, names.EVENTS_CREATE_BATCH)
    types = ",".join(str((w.attributes or {})[names.EVENT_TYPE]) for w in writes)
    for event_type in ("step_created", "step_started", "step_retrying", "run_completed"):
        assert event_type in types
    assert _named(finished, names.RUNS_CREATE)[0].parent is not None
    sends = _named(finished, names.QUEUE_SEND)
    in_deliveries = [s for s in sends if by_id.get(_parent_id(s) or 0) in executes + delivers]
    assert in_deliveries, "the deliveries' sends (step messages, wakes) have spans"
    assert any(_parent_id(s) == start.context.span_id for s in sends), "the start message"


async def test_sends_outside_a_delivery_join_the_runs_trace(
    spans: InMemorySpanExporter, local_app: Callable[..., Workflows]
) -> None:
    """A hook resumed by the client (no span active) wakes a delivery in the run's trace:
    the process knows the run's context, parents the resume's write on it and stamps it
    on the wake."""
    app = local_app()

    @app.workflow
    async def waits() -> Any:
        from treadle import create_hook

        hook = create_hook(token="obs-hook-1")
        return await hook.payload()

    run = await app.start(waits)
    world = await app.world()
    for _ in range(400):
        try:
            await world.hooks.get_by_token("obs-hook-1")
            break
        except HookNotFound:
            await asyncio.sleep(0.025)
    await app.resume_hook("obs-hook-1", {"ok": True})
    assert await run.result(timeout=30) == {"ok": True}
    await app.close(grace_seconds=2)
    finished = spans.get_finished_spans()
    (start,) = _named(finished, names.WORKFLOW_START)
    executes = _named(finished, names.WORKFLOW_EXECUTE)
    assert len(executes) >= 2
    assert {e.context.trace_id for e in executes} == {start.context.trace_id}
    # The resume's own write (no span current at the call) is in the run's trace too.
    (received,) = [
        s for s in _named(finished, names.EVENTS_CREATE)
        if (s.attributes or {}).get(names.EVENT_TYPE) == "hook_received"
    ]  # fmt: skip
    assert received.context.trace_id == start.context.trace_id
